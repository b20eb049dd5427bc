"""HTTP load tests against a running server, the servers we compare with (baselines/), and their shared
helpers: serving (start and stop servers), locust_runs (run locust), cpu_sampling (who used the cores),
load_options (shared options), load_reports (tables, report files) and loadmodels (bundles and sentences to
load with)."""
