"""Print a TEST_MYSQL_URL for the local MariaDB if one answers, else nothing.

Used by ``make test`` so a developer on a machine with MariaDB on
127.0.0.1:3306 (root, empty password) runs the MariaDB-backed tests too.
``--other-driver URL`` prints ``URL`` on the other supported async driver
(aiomysql ↔ asyncmy): ``make test`` runs the MariaDB tests once more on it.
"""

from __future__ import annotations

import sys

import pymysql
from sqlalchemy.engine import make_url

from airuntime_common.db import MYSQL_ASYNC_DRIVERS, mysql_async_driver


def other_driver(url: str) -> str:
    """``url`` with the async MySQL driver it does not name (asyncmy ↔ aiomysql)."""
    current = mysql_async_driver(url)
    other = next(d for d in MYSQL_ASYNC_DRIVERS if d != current)
    return make_url(url).set(drivername=other).render_as_string(hide_password=False)


def main() -> None:
    """Try to connect for at most 2 seconds; print the URL on success."""
    try:
        conn = pymysql.connect(
            host="127.0.0.1", port=3306, user="root", password="", connect_timeout=2
        )
    except Exception:
        return
    conn.close()
    print("mysql+aiomysql://root@127.0.0.1:3306/airt_test")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--other-driver"] and len(sys.argv) == 3:
        print(other_driver(sys.argv[2]))
    else:
        main()
