"""Flag-to-config glue shared by the programs."""
