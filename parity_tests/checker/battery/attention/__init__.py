"""parity_tests/checker/battery/attention"""
