"""What a tool checks in a config and its data before anything is built, each check one module: the config's keys
(``config_keys``), its heads' classes against its datasets' (``head_classes``), its datasets' folders and files
(``data_paths``) and images (``images``), and the weights files it names with the verdict of all a job's
processes (``preflight``). Each returns its problems as lines, or raises a typed error; the tools print them."""
