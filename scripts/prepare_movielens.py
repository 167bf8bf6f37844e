#!/usr/bin/env python3
"""Pack MovieLens-100K, as RecBole 1.2.1 ships it, into one compact binary file.

Usage: prepare_movielens.py SRC_DIR OUT_FILE

SRC_DIR holds RecBole's atomic files ml-100k.inter, ml-100k.user and ml-100k.item
(from recbole/dataset_example/ml-100k/ in the wheel recbole==1.2.1; see
scripts/fetch_movielens.sh). Python 3 standard library only.

Source format: tab-separated text, UTF-8, one header line of typed fields
`name:type` (for example `user_id:token`, `rating:float`, `class:token_seq`), then
one record a line; token_seq fields are space-separated tokens. Columns are found
by name, so their order does not matter:
  ml-100k.inter  user_id:token  item_id:token  rating:float  timestamp:float
  ml-100k.user   user_id:token  age:token  gender:token  occupation:token  zip_code:token
  ml-100k.item   item_id:token  movie_title:token_seq  release_year:token  class:token_seq

Output layout (all integers and floats little-endian, no padding, no alignment):
  offset 0   8 bytes  magic b"TSML100K"
  offset 8   u32      version (1)
  offset 12  u32      n_users (943)
  offset 16  u32      n_items (1682)
  offset 20  u32      n_ratings (100000)
  offset 24  u32      n_occupations (21)
  offset 28  u32      n_genres (19)
  offset 32  ratings, sorted by (timestamp, user, item), as four arrays:
             n_ratings x u32  user (dense id, 0 .. n_users-1)
             n_ratings x u32  item (dense id, 0 .. n_items-1)
             n_ratings x f32  rating (1.0 .. 5.0)
             n_ratings x u32  timestamp (Unix seconds)
  then users, as three arrays:
             n_users x u8     gender (0 = M, 1 = F)
             n_users x u8     age bucket, MovieLens-1M style: 0 = under 18,
                              1 = 18-24, 2 = 25-34, 3 = 35-44, 4 = 45-49,
                              5 = 50-55, 6 = 56 and over
             n_users x u8     occupation id (index into the occupation names)
  then items, as two arrays:
             n_items x u32    genre bitmask: bit g set when the movie has genre g
             n_items x u16    release year (0 when missing; two items lack it)
  then the string table, n_occupations + n_genres entries, each u32 byte length
  followed by that many UTF-8 bytes: the occupation names (sorted, the order of
  MovieLens-100K's u.occupation), then the genre names (the order of
  MovieLens-100K's u.genre, "unknown" first). The file ends there.

Dense ids: users and items are numbered in increasing order of their original
numeric id (in ML-100K the ids are 1..943 and 1..1682, so dense = original - 1).
Every user and item of ml-100k.user / ml-100k.item gets an id, rated or not; a
rating whose user or item is missing from those files is an error.
"""

import os
import struct
import sys

MAGIC = b"TSML100K"
VERSION = 1
# MovieLens-100K's u.genre order (RecBole keeps the names, not the file).
GENRES = [
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
]
GENDERS = {"M": 0, "F": 1}


def age_bucket(age):
    """MovieLens-1M's age groups: <18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+."""
    for i, upper in enumerate((18, 25, 35, 45, 50, 56)):
        if age < upper:
            return i
    return 6


def read_atomic(path):
    """Rows of a RecBole atomic file as dicts keyed by field name (types dropped)."""
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    header = [h.split(":", 1)[0] for h in lines[0].rstrip("\r").split("\t")]
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        line = line.rstrip("\r")
        if not line:
            continue
        cells = line.split("\t")
        if len(cells) != len(header):
            sys.exit(f"{path}:{n}: {len(cells)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, cells)))
    return rows


def number(text, what):
    """An integer written as an integer or as a float with no fraction."""
    v = float(text)
    if v != int(v) or v < 0 or v >= 2**32:
        sys.exit(f"{what}: {text!r} is not a u32")
    return int(v)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    src, out = sys.argv[1], sys.argv[2]
    users = read_atomic(os.path.join(src, "ml-100k.user"))
    items = read_atomic(os.path.join(src, "ml-100k.item"))
    inter = read_atomic(os.path.join(src, "ml-100k.inter"))

    user_ids = sorted(number(u["user_id"], "user_id") for u in users)
    item_ids = sorted(number(i["item_id"], "item_id") for i in items)
    if len(set(user_ids)) != len(user_ids) or len(set(item_ids)) != len(item_ids):
        sys.exit("duplicate user or item ids")
    user_dense = {u: k for k, u in enumerate(user_ids)}
    item_dense = {i: k for k, i in enumerate(item_ids)}

    occupations = sorted({u["occupation"] for u in users})
    occ_id = {o: k for k, o in enumerate(occupations)}
    n_users, n_items = len(user_ids), len(item_ids)
    gender, age, occupation = [0] * n_users, [0] * n_users, [0] * n_users
    for u in users:
        k = user_dense[number(u["user_id"], "user_id")]
        if u["gender"] not in GENDERS:
            sys.exit(f"user {u['user_id']}: gender {u['gender']!r}")
        gender[k] = GENDERS[u["gender"]]
        age[k] = age_bucket(number(u["age"], "age"))
        occupation[k] = occ_id[u["occupation"]]

    genre_bit = {g: k for k, g in enumerate(GENRES)}
    genres, year = [0] * n_items, [0] * n_items
    for it in items:
        k = item_dense[number(it["item_id"], "item_id")]
        mask = 0
        for g in it["class"].split():
            if g not in genre_bit:
                sys.exit(f"item {it['item_id']}: unknown genre {g!r}")
            mask |= 1 << genre_bit[g]
        genres[k] = mask
        y = it["release_year"]
        # Two items have no year ("unkonwn" and "V" in RecBole's file).
        year[k] = int(y) if y.isdigit() and len(y) == 4 else 0

    ratings = []
    seen = set()
    for r in inter:
        u, i = number(r["user_id"], "user_id"), number(r["item_id"], "item_id")
        if u not in user_dense or i not in item_dense:
            sys.exit(f"rating of unknown user {u} or item {i}")
        if (u, i) in seen:
            sys.exit(f"user {u} rated item {i} twice")
        seen.add((u, i))
        rating = float(r["rating"])
        if not 0.0 <= rating <= 5.0:
            sys.exit(f"rating {rating} out of range")
        ratings.append((number(r["timestamp"], "timestamp"), user_dense[u], item_dense[i], rating))
    ratings.sort(key=lambda t: (t[0], t[1], t[2]))
    n = len(ratings)

    blob = bytearray(MAGIC)
    blob += struct.pack("<6I", VERSION, n_users, n_items, n, len(occupations), len(GENRES))
    blob += struct.pack(f"<{n}I", *(t[1] for t in ratings))
    blob += struct.pack(f"<{n}I", *(t[2] for t in ratings))
    blob += struct.pack(f"<{n}f", *(t[3] for t in ratings))
    blob += struct.pack(f"<{n}I", *(t[0] for t in ratings))
    blob += bytes(gender) + bytes(age) + bytes(occupation)
    blob += struct.pack(f"<{n_items}I", *genres)
    blob += struct.pack(f"<{n_items}H", *year)
    for s in occupations + GENRES:
        b = s.encode("utf-8")
        blob += struct.pack("<I", len(b)) + b

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, out)
    print(f"[movielens] {n_users} users, {n_items} items, {n} ratings, "
          f"{len(occupations)} occupations, {len(GENRES)} genres -> {out} ({len(blob)} bytes)")


if __name__ == "__main__":
    main()
