"""The model zoo: model cards, sources (the shipped zoo, folders, http(s), git), the verified
download cache, ``zoo:NAME`` resolution, and publishing. See resolve.py for the entry point."""
