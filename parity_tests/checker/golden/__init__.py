"""parity_tests/checker/golden"""
