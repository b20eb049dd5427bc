"""scripts/gpu-check: the GPU training path proven in one command, on a machine lent for half an hour.

The steps run in order, cheap proofs first, and the results are rewritten after each one, so a run cut
short by its time limit still leaves what it finished. docs/gpu.md says what each step proves.
"""
