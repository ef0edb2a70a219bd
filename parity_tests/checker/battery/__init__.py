"""parity_tests/checker/battery"""
