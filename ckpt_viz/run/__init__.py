"""Runs ckpt_viz makes itself: the built-in model zoo, one run per mode, and the pipeline schedules."""
