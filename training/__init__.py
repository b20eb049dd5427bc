"""Pretraining and fine-tuning (`python -m training.pretrain`, `python -m training.finetune`)."""

import os

# The process that started this one, read when the package is first imported, before torch's import
# (seconds): a torchrun killed during it is not seen by the PR_SET_PDEATHSIG a worker asks for once
# torch is up (pretraining/distributed.py stop_with_launcher), and would leave the worker training alone.
# With this process's own pid: a process forked from it later (a launcher's fork start method) has
# another parent, rightly, and is not judged by it.
STARTED_BY = (os.getpid(), os.getppid())
