"""Code that runs on the cluster inside a Ray job. Never imports ``service``."""
