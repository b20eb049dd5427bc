"""The servers electra-serve is compared with in benchmarks/serve_compare.py (same /detect request body)."""
