"""``python -m alpa_pass.launch [flags] script.py [args]`` (see ``alpa_pass.launch.runner``)."""
from alpa_pass.launch.runner import main

if __name__ == "__main__":
    main()
