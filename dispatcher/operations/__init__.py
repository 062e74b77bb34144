"""The operator's tools, apart from the flow: the CLI, the demo, retention and the periodic sweep.

Nothing of the flow (intake, sending, tracking and what lies under them) imports from here.
"""
