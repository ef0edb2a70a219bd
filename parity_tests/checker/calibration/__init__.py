"""parity_tests/checker/calibration"""
