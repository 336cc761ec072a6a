"""The tools and launchers of tools/, the install, the offline bundle and the pages that document them: each tool
run as a user runs it (tests.helpers.call_tool, run_tool)."""
