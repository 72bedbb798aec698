"""Deploying a draft: the checks an exported folder must pass next to its target, and the commands that serve it."""
