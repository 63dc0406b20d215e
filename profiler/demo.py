def register_demo(subparsers, *a):
    pass
