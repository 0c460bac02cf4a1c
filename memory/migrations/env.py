"""Alembic environment for the experience memory, driven only from code (`memory.migrate`).

The store hands over an open connection in `config.attributes["connection"]`; there is no
alembic.ini and no URL here. Batch mode is on so that SQLite can take ALTER-style changes.
"""

from alembic import context

from memory.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
