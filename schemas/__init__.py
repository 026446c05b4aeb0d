"""The contracts: Arrow schemas of every table that crosses a stage, and job configs."""
