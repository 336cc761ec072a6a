"""Imported at the start of every Python process whose PYTHONPATH holds this folder: the process of a job
whose RANK equals MALA_MM_SLOW_RANK starts 3 s late, so that a launcher test sees the job's processes end in
the order it chooses."""
import os
import time

if os.environ.get('RANK') is not None and os.environ.get('RANK') == os.environ.get('MALA_MM_SLOW_RANK'):
    time.sleep(3)
