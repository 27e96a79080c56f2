from .cli.app import app

app(prog_name="gdnbench")
