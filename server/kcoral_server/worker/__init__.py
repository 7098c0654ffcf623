"""The worker process: runs one program at a time on behalf of the front-end."""
