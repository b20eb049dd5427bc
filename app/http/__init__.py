"""The HTTP layer: the Litestar app, its routes and their bodies, errors and pages. It validates a
request, picks the model and hands the work to scoring.py, which goes through the scheduling layer."""
