"""Score a corpus with a bundle: the fourth program on the bundle, beside the server (docs/bulk.md).

It imports app/model/ (tokenization, windows, the engine, the batch cost rule, stitching and summaries)
and nothing from app/http or app/scheduling, so a document gets the server's numbers without HTTP:
- config.py: the options (options/); fingerprint.py: job.json, and the part size each shard is cut with;
- inputs.py: INPUT -> shards; left_out.py: what INPUT leaves out, named in notes;
- parts.py: shards -> parts; reading.py: a part -> its documents, with rejects and their reasons;
- shard.py: the shard function, one part -> its Parquet file (knows nothing of processes or Ray);
- outputs.py: the Parquet schema, temporary-name-then-rename writes, the manifest;
- local.py / on_ray.py: the shard function on worker processes, or on Ray actors (ray_actor.py, reporting
  through ray_reports.py); ray_cluster.py: the Ray
  cluster started or joined, sized and watched;
- job.py: the driver (checks, plan, Ray joined); preparing.py: --out held, checked for a new job or a resume,
  and written first; scoring_run.py: the parts scored and recorded, the summary, the exit status;
- progress.py: the progress line.
Ray and pyarrow come with the `bulk` extra; the serving install has neither.
"""
