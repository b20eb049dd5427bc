"""The scheduling layer: admission (what may start), batch forming and the runners that run batches,
where a batch runs, the memory it may use, and the server's lifecycle (serving, draining, stopped)."""
