"""The torch-side readers behind `record(memory=..., graphs=...)`: memory by category and graph snapshots."""
