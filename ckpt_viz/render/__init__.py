"""Renderers: pure functions from trace data to text, DOT or chart data. No torch import."""
