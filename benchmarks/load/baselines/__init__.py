"""The servers electra-serve is compared with in benchmarks/load/serve_compare.py (same /detect request body)."""
