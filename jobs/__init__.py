"""The Ray jobs: each reads a config, starts or joins the Ray session, runs pipelines/ on the cluster, writes its outputs, fingerprints and manifest."""
