"""The batteries: what every spec's cases must cover and how they are built, by one builder.
Generic: covering arrays over any spec's factors (``pairs``), a kernel's limits (``limits``), the
batteries and cases by name (``catalog``), the fuzzer (``fuzz``). Each family of cases has a
folder: ``attention/`` (kernels over whole sequences) and ``decode/`` (kernels over a cache),
each with its case type, sizes and builder.

Tests: tests/checker/battery/
"""
