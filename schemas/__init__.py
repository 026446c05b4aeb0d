"""The contracts at the bottom of the imports: the Arrow schemas of the tables that cross
modules (tables.py), the errors every layer raises (errors.py) and the one digest of a
JSON-able value (digest.py). Job configs are in logicrank.pipelines.config."""
