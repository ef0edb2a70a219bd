"""parity_tests/checker/report"""
