"""Repository-wide test configuration (the plugin itself loads through its entry point)."""
