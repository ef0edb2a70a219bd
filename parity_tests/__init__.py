"""parity_tests: weight transfer, NumPy vs torch parity, the tolerance policy and the kernel checker."""
