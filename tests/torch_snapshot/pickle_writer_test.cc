// The pickle writer byte for byte against CPython's opcodes, and read back by python3's pickle.load.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "views/pickle_writer.h"

using gpumem::analysis::pickle_writer;
using gpumem::analysis::to_valid_utf8;

namespace {

// Runs `fill` on a writer over a temporary file and returns the bytes written.
template <typename F>
std::string pickled(F&& fill) {
    char name[] = "/tmp/gpumem-pickle-test-XXXXXX";
    int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    {
        pickle_writer w(fd);
        fill(w);
        w.flush();
        REQUIRE_FALSE(w.failed());
    }
    ::close(fd);
    std::ifstream f(name, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    ::unlink(name);
    return ss.str();
}

std::string bytes(std::initializer_list<int> b) {
    std::string s;
    for (int c : b) s.push_back(char(c));
    return s;
}

}  // namespace

TEST_CASE("integers take the shortest opcode CPython would use") {
    auto one = [](auto fill) {
        std::string s = pickled([&](pickle_writer& w) { fill(w); });
        return s;
    };
    CHECK(one([](pickle_writer& w) { w.integer(0); }) == bytes({'K', 0}));
    CHECK(one([](pickle_writer& w) { w.integer(255); }) == bytes({'K', 255}));
    CHECK(one([](pickle_writer& w) { w.integer(256); }) == bytes({'M', 0, 1}));
    CHECK(one([](pickle_writer& w) { w.integer(65535); }) == bytes({'M', 255, 255}));
    CHECK(one([](pickle_writer& w) { w.integer(65536); }) == bytes({'J', 0, 0, 1, 0}));
    CHECK(one([](pickle_writer& w) { w.integer(-1); }) == bytes({'J', 255, 255, 255, 255}));
    CHECK(one([](pickle_writer& w) { w.integer(INT32_MAX); }) == bytes({'J', 255, 255, 255, 127}));
    // 2^31: LONG1 needs a zero byte above 0x80 so that it is not negative (pickle.dumps(2**31)).
    CHECK(one([](pickle_writer& w) { w.integer(int64_t(1) << 31); }) == bytes({0x8a, 5, 0, 0, 0, 0x80, 0}));
    CHECK(one([](pickle_writer& w) { w.integer(int64_t(INT32_MIN) - 1); }) == bytes({0x8a, 5, 255, 255, 255, 127, 255}));
    CHECK(one([](pickle_writer& w) { w.integer(INT64_MAX); }) == bytes({0x8a, 8, 255, 255, 255, 255, 255, 255, 255, 127}));
    CHECK(one([](pickle_writer& w) { w.integer(INT64_MIN); }) == bytes({0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80}));
    CHECK(one([](pickle_writer& w) { w.uinteger(UINT64_MAX); }) == bytes({0x8a, 9, 255, 255, 255, 255, 255, 255, 255, 255, 0}));
    CHECK(one([](pickle_writer& w) { w.uinteger(0x7f3a40000000ull); }) == bytes({0x8a, 6, 0, 0, 0, 0x40, 0x3a, 0x7f}));
}

TEST_CASE("strings, floats, constants and the memo") {
    CHECK(pickled([](pickle_writer& w) { w.str("ab"); }) == bytes({0x8c, 2, 'a', 'b'}));
    std::string long_s(300, 'x');
    CHECK(pickled([&](pickle_writer& w) { w.str(long_s); }) == bytes({'X', 44, 1, 0, 0}) + long_s);
    CHECK(pickled([](pickle_writer& w) { w.real(1.5); }) == bytes({'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}));
    CHECK(pickled([](pickle_writer& w) {
              w.boolean(true);
              w.boolean(false);
              w.none();
          }) == bytes({0x88, 0x89, 'N'}));
    CHECK(pickled([](pickle_writer& w) {
              w.begin_list();
              CHECK(w.end_list_memo() == 0);
              w.get(0);
              w.str_memo("ab");
              w.str_memo("ab");
          }) == bytes({']', '(', 'e', 'r', 0, 0, 0, 0, 'j', 0, 0, 0, 0, 0x8c, 2, 'a', 'b', 'r', 1, 0, 0, 0, 'j', 1, 0, 0, 0}));
}

TEST_CASE("bytes that are not UTF-8 become U+FFFD, well-formed text passes") {
    CHECK(to_valid_utf8("plain") == "plain");
    CHECK(to_valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    CHECK(to_valid_utf8("a\xff" "b") == "a\xef\xbf\xbd" "b");                 // a stray byte
    CHECK(to_valid_utf8("\xc3") == "\xef\xbf\xbd");                            // cut sequence
    CHECK(to_valid_utf8("\xc0\xaf") == "\xef\xbf\xbd\xef\xbf\xbd");            // overlong '/'
    CHECK(to_valid_utf8("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
    CHECK(to_valid_utf8("\xf4\x90\x80\x80").find("\xf4\x90") == std::string::npos);  // past U+10FFFF
    CHECK(pickled([](pickle_writer& w) { w.str("\xff"); }) == bytes({0x8c, 3, 0xef, 0xbf, 0xbd}));
}

TEST_CASE("a string of 255 bytes is the last SHORT_BINUNICODE, one of 256 a BINUNICODE") {
    // SHORT_BINUNICODE's length is one byte: 256 written there would read as 0 and the rest of
    // the string as opcodes.
    std::string s255(255, 'y'), s256(256, 'y');
    CHECK(pickled([&](pickle_writer& w) { w.str(s255); }) == bytes({0x8c, 255}) + s255);
    CHECK(pickled([&](pickle_writer& w) { w.str(s256); }) == bytes({'X', 0, 1, 0, 0}) + s256);
}

TEST_CASE("overlong three-byte forms and a lone 0x80 are not passed through as UTF-8") {
    // Python's pickle.load decodes each string strictly: one invalid sequence and the whole
    // snapshot fails to load in memory_viz.
    CHECK(to_valid_utf8("\xe0\x80\xaf") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // overlong '/'
    CHECK(to_valid_utf8("\xe0\xa0\x80") == "\xe0\xa0\x80");                          // U+0800, the first
    CHECK(pickled([](pickle_writer& w) { w.str("a\x80"); }) == bytes({0x8c, 4, 'a', 0xef, 0xbf, 0xbd}));
}

TEST_CASE("a large nested value reads back in python3 exactly") {
    if (std::system("python3 -c 'import pickle' >/dev/null 2>&1") != 0) {
        WARN("python3 not found: the read-back is skipped");
        return;
    }
    char name[] = "/tmp/gpumem-pickle-test-XXXXXX";
    int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    {
        pickle_writer w(fd);
        w.begin();
        w.begin_dict();
        w.key("ints");
        w.begin_list();
        for (int64_t v : {int64_t(0), int64_t(255), int64_t(256), int64_t(65535), int64_t(65536), int64_t(-1),
                          int64_t(INT32_MIN), int64_t(INT32_MAX), int64_t(1) << 31, int64_t(INT32_MIN) - 1,
                          int64_t(INT64_MAX), int64_t(INT64_MIN), int64_t(-256), int64_t(-129), int64_t(-128)})
            w.integer(v);
        w.uinteger(UINT64_MAX);
        w.uinteger(uint64_t(1) << 63);
        w.end_list();
        w.key("many");  // 2500 items: three APPENDS batches, dicts inside, memoized keys
        uint32_t shared = 0;
        w.begin_list();
        for (int i = 0; i < 2500; ++i) {
            w.begin_dict();
            w.str_memo("i");
            w.integer(i);
            w.str_memo("frames");
            if (i == 0) {
                w.begin_list();
                w.str("shared");
                shared = w.end_list_memo();
            } else {
                w.get(shared);
            }
            w.end_dict();
        }
        w.end_list();
        w.key("nested");  // 1001 memoized lists, then memoized strings, in a list: batch boundaries
        w.begin_list();  // fall right after each kind of stored value
        for (int i = 0; i < 1001; ++i) {
            w.begin_list();
            w.integer(i);
            (void)w.end_list_memo();
        }
        for (int i = 0; i < 1000; ++i) w.str_memo(i % 2 ? "odd" : "even");
        for (int i = 0; i < 1000; ++i) {
            w.begin_dict();
            w.str_memo("k");
            w.integer(i);
            (void)w.end_dict_memo();
        }
        w.end_list();
        w.key("strs");
        w.begin_list();
        w.str("");
        w.str(std::string(300, 'y'));
        w.str("caf\xc3\xa9 \"q\" \\ \n\t");
        w.str("bad \xff\xfe end");
        w.end_list();
        w.key("pair");
        w.int_pair(0, 7);
        w.key("f");
        w.real(-2.25);
        w.key("t");
        w.boolean(true);
        w.key("n");
        w.none();
        w.end_dict();
        w.end();
        REQUIRE_FALSE(w.failed());
    }
    ::close(fd);
    std::string script =
        "import pickle,sys\n"
        "d=pickle.load(open(sys.argv[1],'rb'))\n"
        "assert d['ints']==[0,255,256,65535,65536,-1,-2**31,2**31-1,2**31,-2**31-1,2**63-1,-2**63,-256,-129,-128,2**64-1,2**63], d['ints']\n"
        "assert [x['i'] for x in d['many']]==list(range(2500))\n"
        "assert all(x['frames'] is d['many'][0]['frames'] for x in d['many']) and d['many'][0]['frames']==['shared']\n"
        "assert d['nested']==[[i] for i in range(1001)]+[('odd' if i%2 else 'even') for i in range(1000)]+[{'k':i} for i in range(1000)]\n"
        "assert d['strs']==['', 'y'*300, 'caf\\u00e9 \"q\" \\\\ \\n\\t', 'bad \\ufffd\\ufffd end'], d['strs']\n"
        "assert d['pair']==(0,7) and d['f']==-2.25 and d['t'] is True and d['n'] is None\n"
        "print('ok')\n";
    std::string py = std::string(name) + ".py";
    std::ofstream(py) << script;
    int rc = std::system(("python3 " + py + " " + name).c_str());
    ::unlink(py.c_str());
    ::unlink(name);
    CHECK(rc == 0);
}

TEST_CASE("a failed write is reported, not ignored") {
    int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    pickle_writer w(fd);
    w.begin();
    w.str(std::string(3 << 20, 'z'));  // past the 1 MiB buffer: written, and refused
    w.end();
    ::close(fd);
    CHECK(w.failed());
    CHECK(w.error() != 0);
}
