"""SqliteStore: circuit state shared by the processes of one host through one file."""
