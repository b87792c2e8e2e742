"""tuneloop's services. Each imports `shared`, never another service."""
