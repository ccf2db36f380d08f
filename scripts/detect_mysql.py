"""Print a TEST_MYSQL_URL for the local MariaDB if one answers, else nothing.

Used by ``make test`` so a developer on a machine with MariaDB on
127.0.0.1:3306 (root, empty password) runs the MariaDB-backed tests too.
"""

from __future__ import annotations

import pymysql


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
    main()
