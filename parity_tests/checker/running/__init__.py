"""parity_tests/checker/running"""
