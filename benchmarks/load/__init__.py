"""HTTP load tests against a running server, the servers we compare with (baselines/), and their shared
helpers: loadkit (start servers, run locust, tables) and loadmodels (bundles and sentences to load with)."""
