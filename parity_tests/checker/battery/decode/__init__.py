"""parity_tests/checker/battery/decode"""
