"""The demo task (support tickets to a JSON object) and its teacher, a stand-in frontier model."""
