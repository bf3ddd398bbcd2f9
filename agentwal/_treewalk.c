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
 *           holds only its mode's type bits when the file system gives the
 *           type in the listing (no lstat is made for it, as os.DirEntry);
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

/* The Python result of a listing made without errors. */
static PyObject *
build(listing *l)
{
    size_t sig_len = 0, good = 0, ndirs = 0;
    int64_t newest = 0;
    for (size_t i = 0; i < l->n; i++) {
        entry *e = &l->items[i];
        switch (e->kind) {
        case 'f':
            sig_len += e->len + 2 + RECORD;
            newest = e->rec[1] > newest ? e->rec[1] : newest;
            break;
        case 'd':
            sig_len += e->len + 2;
            ndirs++;
            break;
        case 'l':
            sig_len += e->len + 3 + e->tlen;
            break;
        }
        good += e->kind == 'f' || e->kind == 'd' || e->kind == 'l' || e->kind == 'o';
    }
    PyObject *sigs = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sig_len);
    PyObject *stats = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(good * RECORD));
    PyObject *names = PyList_New((Py_ssize_t)good);
    PyObject *dirs = PyList_New((Py_ssize_t)ndirs);
    PyObject *targets = PyDict_New();
    PyObject *errors = PyList_New(0);
    PyObject *result = NULL;
    if (!sigs || !stats || !names || !dirs || !targets || !errors)
        goto done;
    char *s = PyBytes_AS_STRING(sigs), *r = PyBytes_AS_STRING(stats);
    Py_ssize_t at = 0, at_dir = 0;
    for (size_t i = 0; i < l->n; i++) {
        entry *e = &l->items[i];
        const char *name = l->names.data + e->name;
        if (e->kind == 0)
            continue;
        PyObject *bname = PyBytes_FromStringAndSize(name, (Py_ssize_t)e->len);
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
        if (e->kind == 'o')
            continue;
        memcpy(s, name, e->len);
        s += e->len;
        *s++ = '\0';
        *s++ = e->kind;
        if (e->kind == 'f') {
            memcpy(s, r - RECORD, RECORD);
            s += RECORD;
        } else if (e->kind == 'd') {
            Py_INCREF(bname);
            PyList_SET_ITEM(dirs, at_dir++, bname);
        } else {
            const char *target = l->targets.data + e->target;
            memcpy(s, target, e->tlen);
            s += e->tlen;
            *s++ = '\0';
            PyObject *t = PyBytes_FromStringAndSize(target, (Py_ssize_t)e->tlen);
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
    Py_ssize_t nskip = PyTuple_GET_SIZE(skip);
    const char **names = PyMem_Calloc((size_t)nskip + 1, sizeof *names);
    size_t *lens = PyMem_Calloc((size_t)nskip + 1, sizeof *lens);
    if (names == NULL || lens == NULL) {
        PyMem_Free(names);
        PyMem_Free(lens);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nskip; i++) {
        PyObject *item = PyTuple_GET_ITEM(skip, i);
        if (!PyBytes_Check(item)) {
            PyMem_Free(names);
            PyMem_Free(lens);
            PyErr_SetString(PyExc_TypeError, "scan: skip must be a tuple of bytes");
            return NULL;
        }
        names[i] = PyBytes_AS_STRING(item);
        lens[i] = (size_t)PyBytes_GET_SIZE(item);
    }
    listing l;
    memset(&l, 0, sizeof l);
    Py_BEGIN_ALLOW_THREADS
    list_dir(&l, fd, path, names, lens, nskip);
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
        result = build(&l);
    }
    listing_free(&l);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(dir, skip) -> (sigs, newest, names, stats, targets, dirs, errors): one "
     "directory's listing (see agentwal.tree_scan.Listing)."},
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
