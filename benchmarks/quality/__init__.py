"""Model quality: detector hit rate, discriminator probes, ELECTRA vs MLM at equal compute."""
