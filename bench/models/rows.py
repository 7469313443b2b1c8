"""How the models cut their token rows into the row blocks of their GEMMs, for any number of rows.

A block of 16 to 64 rows keeps a BRGEMM's B panel busy; fewer rows read each weight for fewer
products, so a prompt of 127 tokens cut into 127 blocks of one ran at half the speed of 128 tokens.
Blocks must divide the rows (each nest has one block size), so where no divisor lies in 16..64
the smallest divisor above 64 is taken (a prime count of rows: one block of all of them).

>>> row_block(1024, 2), row_block(48, 2), row_block(127, 2), row_block(536, 2), row_block(13, 2)
(64, 24, 127, 67, 13)
"""

LOW, HIGH = 16, 64


def row_block(rows, threads):
    """Rows per block for ``rows`` rows on ``threads`` threads: of the divisors of ``rows`` in
    LOW..HIGH, the one whose busiest thread gets the fewest rows (nests over row blocks hand each
    thread whole blocks), the largest of those; else the smallest divisor above HIGH, else (fewer
    than LOW rows) all of them.

    >>> row_block(192, 2), row_block(192, 1)          # 3 blocks of 64 keep one thread busy twice as long
    (48, 64)
    """
    divisors = [b for b in range(1, rows + 1) if rows % b == 0]
    mid = [b for b in divisors if LOW <= b <= HIGH]
    if mid:
        return min(mid, key=lambda b: (-(-rows // b // threads) * b, -b))
    return min([b for b in divisors if b > HIGH] or [rows])
