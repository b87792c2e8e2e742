"""Uploads: the Files API, import streams and the file formats they are read in."""
