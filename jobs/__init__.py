"""Ray entry points: read a config, build the Ray Data plan, call pipelines/, write outputs."""
