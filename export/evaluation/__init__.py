"""How a detector is evaluated, in one place: held-out sentences with one word swapped (by a generator,
by a word of similar frequency, by a word of the same part of speech) beside clean ones, scored through
the server's own code path (export/wordscores.py: its tokenizer, windows, session options and
post-processing), and the figures read from that.

- items.py builds the sentences: the export's calibration set, the benchmarks' item sets
  (benchmarks/quality/data/*_items.json), and the measurement sets of every sentence source;
- scoring.py scores them: what calibration fits, and what the quality benchmarks and the test of the
  shipped models report (top-1, spans, clean sentences flagged, ECE, by length and position).

Export calibration (export/calibrate.py), benchmarks.quality.user_sentences, everyday_sentences and
int8_agreement, and tests/test_shipped_models.py all use it.
"""
