"""parity_tests/checker/judge"""
