import os
import sys

# the checkout's library, whether or not a copy is installed
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
