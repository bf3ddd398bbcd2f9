/* agentwal._treewalk: one directory's listing, lstat of every entry, and the
 * stat-cache signatures of tree_cache.py, in one call with the GIL released.
 *
 * Theory of operation: tree_scan.py defines what a listing is and holds the
 * pure-Python implementation of it (the fallback, used when this module was
 * not built or AGENTWAL_NO_EXT=1 is set); this file is the same function in C.
 * The walks (tree_snapshot.py, tree_restore.py) call it once per directory, so
 * the per-entry work of a walk (a DirEntry, an lstat through Python, an
 * os.stat_result, a struct.pack) is done here instead, and Python touches
 * only the directories whose digest differs from their stat-cache record.
 *
 * scan(dir, skip) lists the directory `dir` (an open directory descriptor,
 * read through a dup of it and left where it was; or a path, opened here and
 * closed before returning) and lstats each entry relative to the directory's
 * descriptor (fstatat, AT_SYMLINK_NOFOLLOW: a link is never followed). Names
 * in `skip` are left out as if absent. It returns the tuple tree_scan.Listing
 * wraps:
 *
 *   sigs    the entries' signatures, sorted by name and concatenated: a
 *           regular file `name \0 f` + its record, a link `name \0 l target \0`,
 *           a directory `name \0 d` (tree_cache._file_sig and friends);
 *   newest  the newest mtime (ns) among its regular files, 0 if none;
 *   names   every entry's name, sorted (files, links, directories, others);
 *   stats   per name a 40-byte record, little-endian int64 size, mtime_ns,
 *           ctime_ns, inode, mode (tree_cache._FILE_SIG); a directory's record
 *           holds only its mode's type bits (no lstat is made for it, as
 *           os.DirEntry);
 *   targets {name: target} of the links;
 *   dirs    the names of the subdirectories, sorted;
 *   errors  [(name, errno, while reading the link)] of the entries that could
 *           not be looked at (they are in none of the other fields).
 *
 * An entry that vanishes between the listing and its lstat (or readlink) is
 * left out, as the Python walk does. A failure to open or list the directory
 * raises OSError (its errno's subclass), nothing else does; no descriptor is
 * left open on any path. Nothing here decides what is stored or skipped
 * beyond `skip`: the caller applies exclude rules and maps errors.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define RECORD 40

typedef struct {
    size_t name;   /* offset in the names buffer */
    const char *at; /* the name itself, once the buffer is complete (for sorting) */
    size_t len;
    char kind;     /* 'f' file, 'd' directory, 'l' link, 'o' other, '!' lstat failed,
                      '?' readlink failed, 0 vanished */
    int err;
    int64_t rec[5]; /* size, mtime_ns, ctime_ns, inode, mode */
    size_t target;  /* offset in the targets buffer */
    size_t tlen;
} entry;

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

typedef struct {
    entry *items;
    size_t n, cap;
    buffer names, targets;
    int err; /* errno of a failure to open or list the directory, or ENOMEM */
} listing;

static int
buf_add(buffer *b, const char *data, size_t len)
{
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + len)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (grown == NULL)
            return -1;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

static void
listing_free(listing *l)
{
    free(l->items);
    free(l->names.data);
    free(l->targets.data);
}

static int
by_name(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->at, y->at, n);
    if (c != 0)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static int
skipped(const char *name, size_t len, const char *const *skip, const size_t *skip_len,
        Py_ssize_t nskip)
{
    for (Py_ssize_t i = 0; i < nskip; i++)
        if (skip_len[i] == len && memcmp(skip[i], name, len) == 0)
            return 1;
    return 0;
}

/* Reads the link `name` of directory `dfd` into the targets buffer; 0, or an errno. */
static int
read_link(listing *l, int dfd, const char *name, entry *e)
{
    size_t cap = 256;
    for (;;) {
        char *buf = malloc(cap);
        if (buf == NULL)
            return ENOMEM;
        ssize_t n = readlinkat(dfd, name, buf, cap);
        if (n < 0) {
            int err = errno;
            free(buf);
            return err;
        }
        if ((size_t)n < cap) {
            e->target = l->targets.len;
            e->tlen = (size_t)n;
            int failed = buf_add(&l->targets, buf, (size_t)n);
            free(buf);
            return failed ? ENOMEM : 0;
        }
        free(buf);
        if (cap >= ((size_t)1 << 20))
            return ENAMETOOLONG;
        cap *= 2;
    }
}

/* The lstat of one entry (and its link target). */
static void
look_at(listing *l, int dfd, entry *e, unsigned char d_type)
{
    const char *name = l->names.data + e->name;
    struct stat st;
    if (d_type == DT_DIR) { /* as os.DirEntry.is_dir(follow_symlinks=False): no lstat */
        e->kind = 'd';
        e->rec[4] = S_IFDIR;
        return;
    }
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        e->err = errno;
        e->kind = e->err == ENOENT ? 0 : '!';
        return;
    }
    e->rec[0] = (int64_t)st.st_size;
    e->rec[1] = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    e->rec[2] = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    e->rec[3] = (int64_t)st.st_ino;
    e->rec[4] = (int64_t)st.st_mode;
    if (S_ISREG(st.st_mode)) {
        e->kind = 'f';
    } else if (S_ISDIR(st.st_mode)) {
        e->kind = 'd';
        memset(e->rec, 0, sizeof e->rec);
        e->rec[4] = S_IFDIR;
    } else if (S_ISLNK(st.st_mode)) {
        e->err = read_link(l, dfd, name, e);
        e->kind = e->err == 0 ? 'l' : e->err == ENOENT ? 0 : '?';
    } else {
        e->kind = 'o';
    }
}

/* Everything that touches the file system: runs without the GIL. */
static void
list_dir(listing *l, int fd, const char *path, const char *const *skip,
         const size_t *skip_len, Py_ssize_t nskip)
{
    /* dfd: the directory, for fstatat (the caller's descriptor, or one opened here);
       rfd: a descriptor of it for readdir, which closedir closes */
    int dfd = path != NULL ? open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : fd;
    if (dfd < 0) {
        l->err = errno;
        return;
    }
    int rfd = path != NULL ? dfd : fcntl(dfd, F_DUPFD_CLOEXEC, 0);
    if (rfd < 0) {
        l->err = errno;
        return;
    }
    DIR *dir = fdopendir(rfd);
    if (dir == NULL) {
        l->err = errno;
        close(rfd);
        return;
    }
    rewinddir(dir); /* a descriptor read before (a dup shares its offset) */
    unsigned char *types = NULL;
    for (;;) {
        errno = 0;
        struct dirent *d = readdir(dir);
        if (d == NULL) {
            l->err = errno;
            break;
        }
        const char *name = d->d_name;
        size_t len = strlen(name);
        if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
            continue;
        if (skipped(name, len, skip, skip_len, nskip))
            continue;
        if (l->n == l->cap) {
            size_t cap = l->cap ? l->cap * 2 : 64;
            entry *items = realloc(l->items, cap * sizeof *items);
            unsigned char *grown = realloc(types, cap);
            if (grown != NULL)
                types = grown;
            if (items != NULL)
                l->items = items;
            if (items == NULL || grown == NULL) {
                l->err = ENOMEM;
                break;
            }
            l->cap = cap;
        }
        entry *e = &l->items[l->n];
        memset(e, 0, sizeof *e);
        e->name = l->names.len;
        e->len = len;
        if (buf_add(&l->names, name, len + 1) != 0) { /* with its NUL, for fstatat */
            l->err = ENOMEM;
            break;
        }
        types[l->n++] = d->d_type;
    }
    if (l->err == 0)
        for (size_t i = 0; i < l->n; i++) {
            l->items[i].at = l->names.data + l->items[i].name;
            look_at(l, dfd, &l->items[i], types[i]);
        }
    free(types);
    rewinddir(dir); /* leave the caller's descriptor where os.scandir would */
    closedir(dir);  /* closes rfd (dfd too, when it was opened here) */
    if (l->err == 0)
        qsort(l->items, l->n, sizeof *l->items, by_name);
}

static void
put_le64(char *out, int64_t v)
{
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++)
        out[i] = (char)(u >> (8 * i));
}

/* The listing's signatures joined (Listing.sigs), in a malloc'd buffer (NULL: no memory;
   a buffer of one byte stands for none), and the newest mtime of its files. */
static char *
join_sigs(const listing *l, size_t *len, int64_t *newest)
{
    size_t n = 0;
    *newest = 0;
    for (size_t i = 0; i < l->n; i++) {
        const entry *e = &l->items[i];
        if (e->kind == 'f') {
            n += e->len + 2 + RECORD;
            *newest = e->rec[1] > *newest ? e->rec[1] : *newest;
        } else if (e->kind == 'd') {
            n += e->len + 2;
        } else if (e->kind == 'l') {
            n += e->len + 3 + e->tlen;
        }
    }
    char *out = malloc(n ? n : 1), *s = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < l->n; i++) {
        const entry *e = &l->items[i];
        if (e->kind != 'f' && e->kind != 'd' && e->kind != 'l')
            continue;
        memcpy(s, e->at, e->len);
        s += e->len;
        *s++ = '\0';
        *s++ = e->kind;
        if (e->kind == 'f') {
            for (int k = 0; k < 5; k++)
                put_le64(s + 8 * k, e->rec[k]);
            s += RECORD;
        } else if (e->kind == 'l') {
            memcpy(s, l->targets.data + e->target, e->tlen);
            s += e->tlen;
            *s++ = '\0';
        }
    }
    *len = n;
    return out;
}

/* The Python tuple of a listing (tree_scan.Listing's fields), its signatures given. */
static PyObject *
build(const listing *l, const char *sig_data, size_t sig_len, int64_t newest)
{
    size_t good = 0, ndirs = 0;
    for (size_t i = 0; i < l->n; i++) {
        char k = l->items[i].kind;
        good += k == 'f' || k == 'd' || k == 'l' || k == 'o';
        ndirs += k == 'd';
    }
    PyObject *sigs = PyBytes_FromStringAndSize(sig_data, (Py_ssize_t)sig_len);
    PyObject *stats = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(good * RECORD));
    PyObject *names = PyList_New((Py_ssize_t)good);
    PyObject *dirs = PyList_New((Py_ssize_t)ndirs);
    PyObject *targets = PyDict_New();
    PyObject *errors = PyList_New(0);
    PyObject *result = NULL;
    if (!sigs || !stats || !names || !dirs || !targets || !errors)
        goto done;
    char *r = PyBytes_AS_STRING(stats);
    Py_ssize_t at = 0, at_dir = 0;
    for (size_t i = 0; i < l->n; i++) {
        const entry *e = &l->items[i];
        if (e->kind == 0)
            continue;
        PyObject *bname = PyBytes_FromStringAndSize(e->at, (Py_ssize_t)e->len);
        if (bname == NULL)
            goto done;
        if (e->kind == '!' || e->kind == '?') {
            PyObject *err = Py_BuildValue("(NiO)", bname, e->err,
                                          e->kind == '?' ? Py_True : Py_False);
            if (err == NULL || PyList_Append(errors, err) != 0) {
                Py_XDECREF(err);
                goto done;
            }
            Py_DECREF(err);
            continue;
        }
        PyList_SET_ITEM(names, at++, bname); /* steals bname */
        for (int k = 0; k < 5; k++)
            put_le64(r + 8 * k, e->rec[k]);
        r += RECORD;
        if (e->kind == 'd') {
            Py_INCREF(bname);
            PyList_SET_ITEM(dirs, at_dir++, bname);
        } else if (e->kind == 'l') {
            PyObject *t = PyBytes_FromStringAndSize(l->targets.data + e->target,
                                                    (Py_ssize_t)e->tlen);
            if (t == NULL || PyDict_SetItem(targets, bname, t) != 0) {
                Py_XDECREF(t);
                goto done;
            }
            Py_DECREF(t);
        }
    }
    result = Py_BuildValue("(OLOOOOO)", sigs, (long long)newest, names, stats, targets, dirs,
                           errors);
done:
    Py_XDECREF(sigs);
    Py_XDECREF(stats);
    Py_XDECREF(names);
    Py_XDECREF(dirs);
    Py_XDECREF(targets);
    Py_XDECREF(errors);
    return result;
}

static PyObject *
build_listing(const listing *l)
{
    size_t len;
    int64_t newest;
    char *sigs = join_sigs(l, &len, &newest);
    if (sigs == NULL)
        return PyErr_NoMemory();
    PyObject *result = build(l, sigs, len, newest);
    free(sigs);
    return result;
}

/* -- SHA-256 (FIPS 180-4), for a directory's digest: tree_cache._digest ---------------- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void
sha256_block(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16
               | (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g))
                      + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

/* The first 16 bytes of SHA-256(data): a directory's digest. */
static void
digest16(const char *data, size_t len, unsigned char out[16])
{
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const unsigned char *p = (const unsigned char *)data;
    size_t left = len;
    for (; left >= 64; p += 64, left -= 64)
        sha256_block(h, p);
    unsigned char tail[128] = {0};
    memcpy(tail, p, left);
    tail[left] = 0x80;
    size_t end = left < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        tail[end - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha256_block(h, tail);
    if (end == 128)
        sha256_block(h, tail + 64);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (unsigned char)(h[i] >> (24 - 8 * j));
}

static PyObject *
digest(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "digest: bytes expected");
        return NULL;
    }
    unsigned char out[16];
    digest16(PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), out);
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

/* -- the whole-tree pass -------------------------------------------------------------- */

/* Deeper directories are left to the Python walk (each level holds a descriptor here). */
#define MAX_DEPTH 64

typedef struct {
    PyObject *trusted;  /* {rel: digest} of the trusted stat-cache records */
    PyObject *clean;    /* set: rel of each directory as recorded, all below it too */
    PyObject *listings; /* {rel: listing tuple} of every other directory looked into */
    const char *const *skip;
    const size_t *skip_len;
    Py_ssize_t nskip;
    const char *store; /* rel of the store's directory inside the tree, or NULL */
    size_t store_len;
    const char *stop; /* a file name below which the walk is Python's, or NULL */
    size_t stop_len;
} walker;

static int
rel_push(buffer *rel, const char *name, size_t len)
{
    if (rel->len > 0 && buf_add(rel, "/", 1) != 0)
        return -1;
    return buf_add(rel, name, len);
}

/* Walk directory `fd` (at `rel`, which it leaves as it found it): 1 if it is clean,
   0 if not, -1 on a Python error. A directory that cannot be opened or listed is
   not clean and has no listing: the Python walk looks at it again (and reports). */
static int
walk_dir(walker *w, int fd, buffer *rel, int depth)
{
    listing l;
    memset(&l, 0, sizeof l);
    Py_BEGIN_ALLOW_THREADS
    list_dir(&l, fd, NULL, w->skip, w->skip_len, w->nskip);
    Py_END_ALLOW_THREADS
    if (l.err != 0) {
        listing_free(&l);
        if (l.err == ENOMEM) {
            PyErr_NoMemory();
            return -1;
        }
        return 0;
    }
    size_t base = rel->len;
    int clean = depth < MAX_DEPTH, stop = depth >= MAX_DEPTH, failed = 0;
    for (size_t i = 0; i < l.n; i++) {
        entry *e = &l.items[i];
        if (e->kind == '!' || e->kind == '?')
            clean = 0;
        if (w->stop != NULL && e->kind == 'f' && e->len == w->stop_len
            && memcmp(e->at, w->stop, e->len) == 0)
            stop = 1, clean = 0;
        if (w->store != NULL && e->kind == 'd' && base + (base > 0) + e->len == w->store_len
            && memcmp(w->store + w->store_len - e->len, e->at, e->len) == 0
            && (base == 0 || (memcmp(w->store, rel->data, base) == 0 && w->store[base] == '/')))
            e->kind = 0; /* the store itself: not part of the tree */
    }
    size_t sig_len;
    int64_t newest;
    char *sigs = join_sigs(&l, &sig_len, &newest);
    if (sigs == NULL) {
        listing_free(&l);
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key = PyBytes_FromStringAndSize(rel->data, (Py_ssize_t)base);
    if (key == NULL)
        goto fail;
    if (clean) {
        unsigned char d[16];
        digest16(sigs, sig_len, d);
        PyObject *want = PyDict_GetItemWithError(w->trusted, key); /* borrowed */
        if (want == NULL && PyErr_Occurred())
            goto fail;
        clean = want != NULL && PyBytes_Check(want) && PyBytes_GET_SIZE(want) == 16
                && memcmp(PyBytes_AS_STRING(want), d, 16) == 0;
    }
    for (size_t i = 0; i < l.n && !stop; i++) {
        entry *e = &l.items[i];
        if (e->kind != 'd')
            continue;
        int sub;
        Py_BEGIN_ALLOW_THREADS
        sub = openat(fd, e->at, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        Py_END_ALLOW_THREADS
        if (sub < 0) {
            clean = 0;
            continue;
        }
        int got = rel_push(rel, e->at, e->len) == 0 ? walk_dir(w, sub, rel, depth + 1) : -2;
        close(sub);
        rel->len = base;
        if (got == -2) {
            PyErr_NoMemory();
            goto fail;
        }
        if (got < 0)
            goto fail;
        clean &= got;
    }
    if (clean) {
        failed = PySet_Add(w->clean, key);
    } else {
        PyObject *t = build(&l, sigs, sig_len, newest);
        failed = t == NULL || PyDict_SetItem(w->listings, key, t) != 0;
        Py_XDECREF(t);
    }
    Py_DECREF(key);
    free(sigs);
    listing_free(&l);
    return failed ? -1 : clean;
fail:
    Py_XDECREF(key);
    free(sigs);
    listing_free(&l);
    return -1;
}

static int
skip_names(PyObject *skip, const char ***names, size_t **lens)
{
    Py_ssize_t n = PyTuple_GET_SIZE(skip);
    *names = PyMem_Calloc((size_t)n + 1, sizeof **names);
    *lens = PyMem_Calloc((size_t)n + 1, sizeof **lens);
    if (*names == NULL || *lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(skip, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "skip must be a tuple of bytes");
            return -1;
        }
        (*names)[i] = PyBytes_AS_STRING(item);
        (*lens)[i] = (size_t)PyBytes_GET_SIZE(item);
    }
    return 0;
}

static PyObject *
walk(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *top, *skip, *trusted, *store, *stop;
    if (!PyArg_ParseTuple(args, "O!O!O!OO:walk", &PyBytes_Type, &top, &PyTuple_Type, &skip,
                          &PyDict_Type, &trusted, &store, &stop))
        return NULL;
    if ((store != Py_None && !PyBytes_Check(store)) || (stop != Py_None && !PyBytes_Check(stop))) {
        PyErr_SetString(PyExc_TypeError, "walk: store and stop must be bytes or None");
        return NULL;
    }
    if ((size_t)PyBytes_GET_SIZE(top) != strlen(PyBytes_AS_STRING(top))) {
        PyErr_SetString(PyExc_ValueError, "walk: embedded null byte in the path");
        return NULL;
    }
    walker w;
    memset(&w, 0, sizeof w);
    w.trusted = trusted;
    w.nskip = PyTuple_GET_SIZE(skip);
    if (store != Py_None) {
        w.store = PyBytes_AS_STRING(store);
        w.store_len = (size_t)PyBytes_GET_SIZE(store);
    }
    if (stop != Py_None) {
        w.stop = PyBytes_AS_STRING(stop);
        w.stop_len = (size_t)PyBytes_GET_SIZE(stop);
    }
    const char **names = NULL;
    size_t *lens = NULL;
    PyObject *result = NULL;
    buffer rel = {NULL, 0, 0};
    w.clean = PySet_New(NULL);
    w.listings = PyDict_New();
    if (w.clean == NULL || w.listings == NULL || skip_names(skip, &names, &lens) != 0)
        goto done;
    w.skip = names;
    w.skip_len = lens;
    int fd;
    Py_BEGIN_ALLOW_THREADS
    fd = open(PyBytes_AS_STRING(top), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    Py_END_ALLOW_THREADS
    if (fd >= 0) { /* else nothing is known: the Python walk opens it and reports */
        int got = walk_dir(&w, fd, &rel, 0);
        close(fd);
        if (got < 0)
            goto done;
    }
    result = PyTuple_Pack(2, w.clean, w.listings);
done:
    free(rel.data);
    PyMem_Free(names);
    PyMem_Free(lens);
    Py_XDECREF(w.clean);
    Py_XDECREF(w.listings);
    return result;
}

static PyObject *
scan(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *where, *skip;
    if (!PyArg_ParseTuple(args, "OO!:scan", &where, &PyTuple_Type, &skip))
        return NULL;
    int fd = -1;
    const char *path = NULL;
    if (PyBytes_Check(where)) {
        path = PyBytes_AS_STRING(where);
        if ((size_t)PyBytes_GET_SIZE(where) != strlen(path)) {
            PyErr_SetString(PyExc_ValueError, "scan: embedded null byte in the path");
            return NULL;
        }
    } else if (PyLong_Check(where)) {
        long value = PyLong_AsLong(where);
        if (value == -1 && PyErr_Occurred())
            return NULL;
        fd = value > INT_MAX ? -1 : (int)value;
        if (fd < 0) {
            errno = EBADF;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "scan: the directory must be a descriptor or bytes");
        return NULL;
    }
    const char **names = NULL;
    size_t *lens = NULL;
    if (skip_names(skip, &names, &lens) != 0) {
        PyMem_Free(names);
        PyMem_Free(lens);
        return NULL;
    }
    listing l;
    memset(&l, 0, sizeof l);
    Py_BEGIN_ALLOW_THREADS
    list_dir(&l, fd, path, names, lens, PyTuple_GET_SIZE(skip));
    Py_END_ALLOW_THREADS
    PyMem_Free(names);
    PyMem_Free(lens);
    PyObject *result;
    if (l.err == ENOMEM) {
        result = PyErr_NoMemory();
    } else if (l.err != 0) {
        errno = l.err;
        result = path != NULL ? PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, where)
                              : PyErr_SetFromErrno(PyExc_OSError);
    } else {
        result = build_listing(&l);
    }
    listing_free(&l);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(dir, skip) -> (sigs, newest, names, stats, targets, dirs, errors): one "
     "directory's listing (see agentwal.tree_scan.Listing)."},
    {"walk", walk, METH_VARARGS,
     "walk(top, skip, trusted, store, stop) -> (clean, listings): the whole-tree pass "
     "(see agentwal.tree_scan.walk)."},
    {"digest", digest, METH_O, "digest(data) -> the first 16 bytes of SHA-256(data)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "agentwal._treewalk",
    "One directory's listing and lstat, in C (agentwal.tree_scan is the Python twin).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__treewalk(void)
{
    return PyModule_Create(&module);
}
