"""parity_tests/checker/targets"""
