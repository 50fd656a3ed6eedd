"""The app's helpers, shared by the pages: the run on show, the source picker, the cursor, downloads, display."""
