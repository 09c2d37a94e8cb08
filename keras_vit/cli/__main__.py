import sys

from keras_vit.cli.main import main

sys.exit(main())
