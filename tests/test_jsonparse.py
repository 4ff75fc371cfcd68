"""protocol.jsonparse: one strict JSON parser with the same verdict on both interpreters.

The corpus follows Nicolas Seriot's JSONTestSuite naming: ``y_`` must parse to the
value given, ``n_`` must be refused, ``i_`` (implementation-defined in the suite) is
decided here, and ``p_`` cases are this project's rules (depth, length, number range,
duplicate keys). Every refusal names the byte offset it expects, so the two
interpreters are held to the same offsets, not just the same yes/no.
"""

import json

from mpcompat import IS_MICROPYTHON, raises, read_repo_file

from protocol import cbor, jsonl, jsonparse
from protocol.errors import CBORDecodeError
from protocol.frame import MAX_LINE, StreamDecoder
from protocol.jsonparse import JSONError, loads

DUAL = True


class R:
    """Expected refusal: JSONError at byte ``offset`` whose reason holds ``part``."""

    def __init__(self, offset, part):
        self.offset = offset
        self.part = part


def same(a, b):
    """Type-strict equality (1 != 1.0 != True); floats within 1e-12 relative (the
    MicroPython float conversion is not correctly rounded) and with the same sign."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, float) and isinstance(b, float):
        if (a < 0) != (b < 0) or str(a)[0] == "-" and str(b)[0] != "-":
            return False
        return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False
        for i in range(len(a)):
            if not same(a[i], b[i]):
                return False
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b):
            return False
        for k in a:
            if k not in b or not same(a[k], b[k]):
                return False
        return True
    return type(a) is type(b) and a == b


def _nest(n, inner=b""):
    return b"[" * n + inner + b"]" * n


def _nest_obj(n, inner=b"1"):
    return b'{"k":' * n + inner + b"}" * n


BIG = 9223372036854775807  # 2**63 - 1, spelled out: no big-int arithmetic at import

CORPUS = (
    # ---- y_: RFC 8259 JSON, accepted
    ("y_array_arraysWithSpaces", b"[[]   ]", [[]]),
    ("y_array_empty", b"[]", []),
    ("y_array_empty-string", b'[""]', [""]),
    ("y_array_false", b"[false]", [False]),
    ("y_array_heterogeneous", b'[null, 1, "1", {}]', [None, 1, "1", {}]),
    ("y_array_null", b"[null]", [None]),
    ("y_array_with_1_and_newline", b"[1\n]", [1]),
    ("y_array_with_leading_space", b" [1]", [1]),
    ("y_array_with_several_null", b"[1,null,null,null,2]", [1, None, None, None, 2]),
    ("y_array_with_trailing_space", b"[2] ", [2]),
    ("y_number", b"[123e6]", [123e6]),
    ("y_number_0e+1", b"[0e+1]", [0.0]),
    ("y_number_0e1", b"[0e1]", [0.0]),
    ("y_number_after_space", b"[ 4]", [4]),
    ("y_number_double_close_to_zero", b"[-0." + b"0" * 80 + b"1]", [-1e-81]),
    ("y_number_int_with_exp", b"[20e1]", [200.0]),
    ("y_number_minus_zero", b"[-0]", [0]),
    ("y_number_negative_int", b"[-123]", [-123]),
    ("y_number_negative_one", b"[-1]", [-1]),
    ("y_number_real_capital_e", b"[1E22]", [1e22]),
    ("y_number_real_capital_e_neg_exp", b"[1E-2]", [0.01]),
    ("y_number_real_capital_e_pos_exp", b"[1E+2]", [100.0]),
    ("y_number_real_fraction_exponent", b"[123.456e7]", [1234560000.0]),
    ("y_number_real_neg_exp", b"[1e-2]", [0.01]),
    ("y_number_real_pos_exponent", b"[1e+2]", [100.0]),
    ("y_number_simple_int", b"[123]", [123]),
    ("y_number_simple_real", b"[123.456789]", [123.456789]),
    ("y_number_negative_real_zero", b"[-0.0]", [-0.0]),
    ("y_object", b'{"asd":"sdf", "dfg":"fgh"}', {"asd": "sdf", "dfg": "fgh"}),
    ("y_object_basic", b'{"asd":"sdf"}', {"asd": "sdf"}),
    ("y_object_empty", b"{}", {}),
    ("y_object_empty_key", b'{"":0}', {"": 0}),
    ("y_object_escaped_null_in_key", rb'{"foo\u0000bar": 42}', {"foo\x00bar": 42}),
    (
        "y_object_extreme_numbers",
        b'{ "min": -1.0e+28, "max": 1.0e+28 }',
        {"min": -1e28, "max": 1e28},
    ),
    ("y_object_long_strings", b'{"x":[{"id": "' + b"x" * 40 + b'"}]}', {"x": [{"id": "x" * 40}]}),
    ("y_object_simple", b'{"a":[]}', {"a": []}),
    (
        "y_object_string_unicode",
        rb'{"title":"\u041f\u043e\u043b\u0442"}',
        {"title": "\u041f\u043e\u043b\u0442"},
    ),
    ("y_object_with_newlines", b'{\n"a": "b"\n}', {"a": "b"}),
    (
        "y_object_whitespace_everywhere",
        b' \t\r\n{ \t"a" \n: \r[ 1 , 2 ] ,"b":{} }\r\n',
        {"a": [1, 2], "b": {}},
    ),
    ("y_string_1_2_3_bytes_UTF-8_sequences", rb'["\u0060\u012a\u12AB"]', ["\u0060\u012a\u12ab"]),
    ("y_string_accepted_surrogate_pair", rb'["\uD801\udc37"]', ["\U00010437"]),
    (
        "y_string_accepted_surrogate_pairs",
        rb'["\ud83d\ude39\ud83d\udc8d"]',
        ["\U0001f639\U0001f48d"],
    ),
    ("y_string_allowed_escapes", rb'["\"\\\/\b\f\n\r\t"]', ['"\\/\b\f\n\r\t']),
    ("y_string_backslash_and_u_escaped_zero", rb'["\\u0000"]', ["\\u0000"]),
    ("y_string_backslash_doublequotes", rb'["\""]', ['"']),
    ("y_string_comments", b'["a/*b*/c/*d//e"]', ["a/*b*/c/*d//e"]),
    ("y_string_double_escape_a", rb'["\\a"]', ["\\a"]),
    ("y_string_double_escape_n", rb'["\\n"]', ["\\n"]),
    ("y_string_escaped_control_character", rb'["\u0012"]', ["\x12"]),
    ("y_string_escaped_noncharacter", rb'["\uFFFF"]', ["\uffff"]),
    ("y_string_in_array_with_leading_space", b'[ "asd"]', ["asd"]),
    ("y_string_last_surrogates_1_and_2", rb'["\uDBFF\uDFFF"]', ["\U0010ffff"]),
    ("y_string_nbsp_uescaped", rb'["new\u00A0line"]', ["new\xa0line"]),
    ("y_string_nonCharacterInUTF-8_U+10FFFF", b'["\xf4\x8f\xbf\xbf"]', ["\U0010ffff"]),
    ("y_string_nonCharacterInUTF-8_U+FFFF", b'["\xef\xbf\xbf"]', ["\uffff"]),
    ("y_string_null_escape", rb'["\u0000"]', ["\x00"]),
    ("y_string_one-byte-utf-8", rb'["\u002c"]', [","]),
    ("y_string_pi", b'["\xcf\x80"]', ["\u03c0"]),
    ("y_string_reservedCharacterInUTF-8_U+1BFFF", b'["\xf0\x9b\xbf\xbf"]', ["\U0001bfff"]),
    ("y_string_simple_ascii", b'["asd "]', ["asd "]),
    ("y_string_space", b'" "', " "),
    ("y_string_surrogates_U+1D11E_MUSICAL_SYMBOL_G_CLEF", rb'["\uD834\uDd1e"]', ["\U0001d11e"]),
    ("y_string_three-byte-utf-8", rb'["\u0821"]', ["\u0821"]),
    ("y_string_two-byte-utf-8", rb'["\u0123"]', ["\u0123"]),
    ("y_string_u+2028_line_sep", b'["\xe2\x80\xa8"]', ["\u2028"]),
    ("y_string_u+2029_par_sep", b'["\xe2\x80\xa9"]', ["\u2029"]),
    ("y_string_uEscape", rb'["\u0061\u30af\u30EA\u30b9"]', ["a\u30af\u30ea\u30b9"]),
    ("y_string_uescaped_newline", rb'["new\u000Aline"]', ["new\nline"]),
    ("y_string_unescaped_char_delete", b'["\x7f"]', ["\x7f"]),
    ("y_string_unicodeEscapedBackslash", rb'["\u005C"]', ["\\"]),
    ("y_string_unicode_2", b'["\xe2\x8d\x82\xe3\x88\xb4\xe2\x8d\x82"]', ["\u2342\u3234\u2342"]),
    ("y_string_unicode_U+10FFFE_nonchar", rb'["\uDBFF\uDFFE"]', ["\U0010fffe"]),
    ("y_string_unicode_U+FDD0_nonchar", rb'["\uFDD0"]', ["\ufdd0"]),
    ("y_string_unicode_escaped_double_quote", rb'["\u0022"]', ['"']),
    ("y_string_utf8", b'["\xe2\x82\xac\xf0\x9d\x84\x9e"]', ["\u20ac\U0001d11e"]),
    ("y_string_2_byte_boundaries", b'["\xc2\x80\xdf\xbf"]', ["\x80\u07ff"]),
    (
        "y_string_3_byte_boundaries",
        b'["\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80"]',
        ["\u0800\ud7ff\ue000"],
    ),
    ("y_string_4_byte_boundary", b'["\xf0\x90\x80\x80"]', ["\U00010000"]),
    ("y_structure_lonely_false", b"false", False),
    ("y_structure_lonely_int", b"42", 42),
    ("y_structure_lonely_negative_real", b"-0.1", -0.1),
    ("y_structure_lonely_null", b"null", None),
    ("y_structure_lonely_string", b'"asd"', "asd"),
    ("y_structure_lonely_true", b"true", True),
    ("y_structure_string_empty", b'""', ""),
    ("y_structure_trailing_newline", b'["a"]\n', ["a"]),
    ("y_structure_true_in_array", b"[true]", [True]),
    ("y_structure_whitespace_array", b" [] ", []),
    # ---- n_: not JSON, refused
    ("n_array_1_true_without_comma", b"[1 true]", R(3, "where ',' or ']' belongs")),
    ("n_array_a_invalid_utf8", b"[a\xe5]", R(1, "not a JSON value: a")),
    ("n_array_colon_instead_of_comma", b'["": 1]', R(3, "where ',' or ']' belongs")),
    ("n_array_comma_after_close", b'[""],', R(4, "after the value")),
    ("n_array_comma_and_number", b"[,1]", R(1, "where a value belongs")),
    ("n_array_double_comma", b"[1,,2]", R(3, "where a value belongs")),
    ("n_array_double_extra_comma", b'["x",,]', R(5, "where a value belongs")),
    ("n_array_extra_close", b'["x"]]', R(5, "after the value")),
    ("n_array_extra_comma", b'["",]', R(4, "trailing comma")),
    ("n_array_incomplete", b'["x"', R(4, "unexpected end")),
    ("n_array_incomplete_invalid_value", b"[x", R(1, "not a JSON value: x")),
    ("n_array_inner_array_no_comma", b"[3[4]]", R(2, "where ',' or ']' belongs")),
    ("n_array_invalid_utf8", b"[\xff]", R(1, "byte 0xff where a value belongs")),
    ("n_array_items_separated_by_semicolon", b"[1:2]", R(2, "where ',' or ']' belongs")),
    ("n_array_just_comma", b"[,]", R(1, "where a value belongs")),
    ("n_array_just_minus", b"[-]", R(1, "digit after '-'")),
    ("n_array_missing_value", b'[   , ""]', R(4, "where a value belongs")),
    ("n_array_newlines_unclosed", b'["a",\n4\n,1,', R(11, "unexpected end")),
    ("n_array_number_and_comma", b"[1,]", R(3, "trailing comma")),
    ("n_array_number_and_several_commas", b"[1,,]", R(3, "where a value belongs")),
    ("n_array_spaces_vertical_tab_formfeed", b'["\x0ba"\\f]', R(2, "raw control character 0x0b")),
    ("n_array_star_inside", b"[*]", R(1, "'*' where a value belongs")),
    ("n_array_unclosed", b'[""', R(3, "unexpected end")),
    ("n_array_unclosed_trailing_comma", b"[1,", R(3, "unexpected end")),
    ("n_array_unclosed_with_new_lines", b"[1,\n1\n,1", R(8, "unexpected end")),
    ("n_array_unclosed_with_object_inside", b"[{}", R(3, "unexpected end")),
    ("n_incomplete_false", b"[fals]", R(1, "not a JSON value: fals")),
    ("n_incomplete_null", b"[nul]", R(1, "not a JSON value: nul")),
    ("n_incomplete_true", b"[tru]", R(1, "not a JSON value: tru")),
    ("n_multidigit_number_then_00", b"123\x00", R(3, "byte 0x00 after the value")),
    ("n_number_++", b"[++1234]", R(1, "'+' where a value belongs")),
    ("n_number_+1", b"[+1]", R(1, "'+' where a value belongs")),
    ("n_number_+Inf", b"[+Inf]", R(1, "'+' where a value belongs")),
    ("n_number_-01", b"[-01]", R(1, "leading zeros")),
    ("n_number_-1.0.", b"[-1.0.]", R(5, "where ',' or ']' belongs")),
    ("n_number_-2.", b"[-2.]", R(1, "digits after '.'")),
    ("n_number_-NaN", b"[-NaN]", R(1, "not a JSON value: -NaN")),
    ("n_number_.-1", b"[.-1]", R(1, "'.' where a value belongs")),
    ("n_number_.2e-3", b"[.2e-3]", R(1, "'.' where a value belongs")),
    ("n_number_0.1.2", b"[0.1.2]", R(4, "where ',' or ']' belongs")),
    ("n_number_0.3e+", b"[0.3e+]", R(1, "digits in its exponent")),
    ("n_number_0.3e", b"[0.3e]", R(1, "digits in its exponent")),
    ("n_number_0.e1", b"[0.e1]", R(1, "digits after '.'")),
    ("n_number_0_capital_E+", b"[0E+]", R(1, "digits in its exponent")),
    ("n_number_0_capital_E", b"[0E]", R(1, "digits in its exponent")),
    ("n_number_1.0e-", b"[1.0e-]", R(1, "digits in its exponent")),
    ("n_number_1_000", b"[1 000.0]", R(3, "where ',' or ']' belongs")),
    ("n_number_1eE2", b"[1eE2]", R(1, "digits in its exponent")),
    ("n_number_2.e+3", b"[2.e+3]", R(1, "digits after '.'")),
    ("n_number_Inf", b"[Inf]", R(1, "not a JSON value: Inf")),
    ("n_number_NaN", b"[NaN]", R(1, "not a JSON value: NaN")),
    ("n_number_U+FF11_fullwidth_digit_one", b"[\xef\xbc\x91]", R(1, "byte 0xef where a value")),
    ("n_number_expression", b"[1+2]", R(2, "'+' where ',' or ']' belongs")),
    ("n_number_hex_1_digit", b"[0x1]", R(2, "'x' where ',' or ']' belongs")),
    ("n_number_hex_2_digits", b"[0x42]", R(2, "'x' where")),
    ("n_number_infinity", b"[Infinity]", R(1, "not a JSON value: Infinity")),
    ("n_number_invalid+-", b"[0e+-1]", R(1, "digits in its exponent")),
    ("n_number_invalid-negative-real", b"[-123.123foo]", R(9, "'f' where")),
    ("n_number_invalid-utf-8-in-int", b"[0\xe5]", R(2, "byte 0xe5 where")),
    ("n_number_minus_infinity", b"[-Infinity]", R(1, "not a JSON value: -Infinity")),
    ("n_number_minus_sign_with_trailing_garbage", b"[-foo]", R(1, "not a JSON value: -foo")),
    ("n_number_minus_space_1", b"[- 1]", R(1, "digit after '-'")),
    ("n_number_neg_int_starting_with_zero", b"[-012]", R(1, "leading zeros")),
    ("n_number_neg_real_without_int_part", b"[-.123]", R(1, "digit after '-'")),
    ("n_number_real_garbage_after_e", b"[1ea]", R(1, "digits in its exponent")),
    ("n_number_real_without_fractional_part", b"[1.]", R(1, "digits after '.'")),
    ("n_number_starting_with_dot", b"[.123]", R(1, "'.' where a value belongs")),
    ("n_number_with_alpha", b"[1.2a-3]", R(4, "'a' where")),
    ("n_number_with_leading_zero", b"[012]", R(1, "leading zeros")),
    ("n_object_bad_value", b'["x", truth]', R(6, "not a JSON value: truth")),
    ("n_object_bracket_key", b'{[: "x"}', R(1, "'[' where a key")),
    ("n_object_comma_instead_of_colon", b'{"x", null}', R(4, "expected ':'")),
    ("n_object_double_colon", b'{"x"::"b"}', R(5, "':' where a value belongs")),
    ("n_object_emoji", b"{\xf0\x9f\x87\xa8\xf0\x9f\x87\xad}", R(1, "byte 0xf0 where a key")),
    ("n_object_garbage_at_end", b'{"a":"a" 123}', R(9, "'1' where ',' or '}' belongs")),
    ("n_object_key_with_single_quotes", b"{key: 'value'}", R(1, "'k' where a key")),
    (
        "n_object_lone_continuation_byte_in_key_and_trailing_comma",
        b'{"\xb9":"0",}',
        R(2, "stray continuation"),
    ),
    ("n_object_missing_colon", b'{"a" b}', R(5, "expected ':'")),
    ("n_object_missing_key", b'{:"b"}', R(1, "':' where a key")),
    ("n_object_missing_semicolon", b'{"a" "b"}', R(5, "expected ':'")),
    ("n_object_missing_value", b'{"a":', R(5, "unexpected end")),
    ("n_object_no-colon", b'{"a"', R(4, "expected ':'")),
    ("n_object_non_string_key", b"{1:1}", R(1, "'1' where a key")),
    ("n_object_non_string_key_but_huge_number_instead", b"{9999E9999:1}", R(1, "'9' where a key")),
    ("n_object_repeated_null_null", b"{null:null,null:null}", R(1, "'n' where a key")),
    ("n_object_several_trailing_commas", b'{"id":0,,,,,}', R(8, "',' where a key")),
    ("n_object_single_quote", b"{'a':0}", R(1, "''' where a key")),
    ("n_object_trailing_comma", b'{"id":0,}', R(8, "trailing comma before '}'")),
    ("n_object_trailing_comment", b'{"a":"b"}/**/', R(9, "'/' after the value")),
    ("n_object_trailing_comment_slash_open_incomplete", b'{"a":"b"}/', R(9, "'/' after")),
    ("n_object_two_commas_in_a_row", b'{"a":"b",,"c":"d"}', R(9, "',' where a key")),
    ("n_object_unquoted_key", b'{a: "b"}', R(1, "'a' where a key")),
    ("n_object_unterminated-value", b'{"a":"a', R(5, "unterminated string")),
    ("n_object_with_single_string", b'{ "foo" : "bar", "a" }', R(21, "expected ':'")),
    ("n_object_with_trailing_garbage", b'{"a":"b"}#', R(9, "'#' after the value")),
    ("n_single_space", b" ", R(1, "unexpected end")),
    ("n_string_1_surrogate_then_escape", rb'["\uD800\"]', R(2, "lone surrogate")),
    ("n_string_1_surrogate_then_escape_u", rb'["\uD800\u"]', R(8, "four hex digits")),
    ("n_string_1_surrogate_then_escape_u1", rb'["\uD800\u1"]', R(8, "four hex digits")),
    ("n_string_1_surrogate_then_escape_u1x", rb'["\uD800\u1x"]', R(8, "four hex digits")),
    ("n_string_accentuated_char_no_quotes", b"[\xc3\xa9]", R(1, "byte 0xc3 where a value")),
    ("n_string_backslash_00", b'["\\\x00"]', R(2, "invalid escape: byte 0x00")),
    ("n_string_escape_x", rb'["\x00"]', R(2, "invalid escape: 'x'")),
    ("n_string_escaped_backslash_bad", rb'["\\\"]', R(1, "unterminated string")),
    ("n_string_escaped_ctrl_char_tab", b'["\\\t"]', R(2, "invalid escape: byte 0x09")),
    ("n_string_escaped_emoji", b'["\\\xf0\x9f\x8c\x80"]', R(2, "invalid escape: byte 0xf0")),
    ("n_string_incomplete_escape", rb'["\"]', R(1, "unterminated string")),
    ("n_string_incomplete_escaped_character", rb'["\u00A"]', R(2, "four hex digits")),
    ("n_string_incomplete_surrogate", rb'["\uD834\uDd"]', R(8, "four hex digits")),
    (
        "n_string_incomplete_surrogate_escape_invalid",
        rb'["\uD800\uD800\x"]',
        R(2, "lone surrogate"),
    ),
    ("n_string_invalid-utf-8-in-escape", b'["\\u\xe5"]', R(2, "four hex digits")),
    ("n_string_invalid_backslash_esc", rb'["\a"]', R(2, "invalid escape: 'a'")),
    ("n_string_invalid_unicode_escape", rb'["\uqqqq"]', R(2, "four hex digits")),
    ("n_string_invalid_utf8_after_escape", b'["\\\xe5"]', R(2, "invalid escape: byte 0xe5")),
    ("n_string_leading_uescaped_thinspace", rb'[\u0020"asd"]', R(1, "'\\' where a value")),
    ("n_string_no_quotes_with_bad_escape", rb"[\n]", R(1, "'\\' where a value")),
    ("n_string_single_doublequote", b'"', R(0, "unterminated string")),
    ("n_string_single_quote", b"['single quote']", R(1, "''' where a value")),
    ("n_string_single_string_no_double_quotes", b"abc", R(0, "not a JSON value: abc")),
    ("n_string_start_escape_unclosed", b'["\\', R(1, "unterminated string")),
    ("n_string_unescaped_ctrl_char", b'["a\x00a"]', R(3, "raw control character 0x00")),
    ("n_string_unescaped_newline", b'["new\nline"]', R(5, "raw control character 0x0a")),
    ("n_string_unescaped_tab", b'["\t"]', R(2, "raw control character 0x09")),
    ("n_string_unicode_CapitalU", rb'"\UA66D"', R(1, "invalid escape: 'U'")),
    ("n_string_with_trailing_garbage", b'""x', R(2, "'x' after the value")),
    ("n_structure_U+2060_word_joined", b"[\xe2\x81\xa0]", R(1, "byte 0xe2 where a value")),
    ("n_structure_UTF8_BOM_no_data", b"\xef\xbb\xbf", R(0, "byte order mark")),
    ("n_structure_angle_bracket_.", b"<.>", R(0, "'<' where a value belongs")),
    ("n_structure_angle_bracket_null", b"[<null>]", R(1, "'<' where a value belongs")),
    ("n_structure_array_trailing_garbage", b"[1]x", R(3, "'x' after the value")),
    ("n_structure_array_with_extra_array_close", b"[1]]", R(3, "']' after the value")),
    ("n_structure_array_with_unclosed_string", b'["asd]', R(1, "unterminated string")),
    ("n_structure_ascii-unicode-identifier", b"a\xc3\xa5", R(0, "not a JSON value: a")),
    ("n_structure_capitalized_True", b"[True]", R(1, "not a JSON value: True")),
    ("n_structure_close_unopened_array", b"1]", R(1, "']' after the value")),
    ("n_structure_comma_instead_of_closing_brace", b'{"x": true,', R(11, "unexpected end")),
    ("n_structure_double_array", b"[][]", R(2, "'[' after the value")),
    ("n_structure_end_array", b"]", R(0, "']' where a value belongs")),
    ("n_structure_incomplete_UTF8_BOM", b"\xef\xbb{}", R(0, "byte 0xef where a value")),
    ("n_structure_lone-invalid-utf-8", b"\xe5", R(0, "byte 0xe5 where a value")),
    ("n_structure_lone-open-bracket", b"[", R(1, "unexpected end")),
    ("n_structure_no_data", b"", R(0, "unexpected end")),
    ("n_structure_null-byte-outside-string", b"[\x00]", R(1, "byte 0x00 where a value")),
    ("n_structure_number_with_trailing_garbage", b"2@", R(1, "'@' after the value")),
    ("n_structure_object_followed_by_closing_object", b"{}}", R(2, "'}' after the value")),
    ("n_structure_object_unclosed_no_value", b'{"":', R(4, "unexpected end")),
    ("n_structure_object_with_comment", b'{"a":/*comment*/"b"}', R(5, "'/' where a value")),
    ("n_structure_object_with_trailing_garbage", b'{"a": true} "x"', R(12, "'\"' after the value")),
    ("n_structure_open_array_apostrophe", b"['", R(1, "''' where a value")),
    ("n_structure_open_array_comma", b"[,", R(1, "',' where a value")),
    ("n_structure_open_array_open_object", b"[{", R(2, "unexpected end")),
    ("n_structure_open_array_open_string", b'["a', R(1, "unterminated string")),
    ("n_structure_open_array_string", b'["a"', R(4, "unexpected end")),
    ("n_structure_open_object", b"{", R(1, "unexpected end")),
    ("n_structure_open_object_close_array", b"{]", R(1, "']' where a key")),
    ("n_structure_open_object_comma", b"{,", R(1, "',' where a key")),
    ("n_structure_open_object_open_array", b"{[", R(1, "'[' where a key")),
    ("n_structure_open_object_open_string", b'{"a', R(1, "unterminated string")),
    ("n_structure_open_object_string_with_apostrophes", b"{'a'", R(1, "''' where a key")),
    ("n_structure_single_eacute", b"\xe9", R(0, "byte 0xe9 where a value")),
    ("n_structure_single_star", b"*", R(0, "'*' where a value")),
    ("n_structure_trailing_#", b'{"a":"b"}#{}', R(9, "'#' after the value")),
    ("n_structure_uescaped_LF_before_string", rb'[\u000A""]', R(1, "'\\' where a value")),
    ("n_structure_unclosed_array_partial_null", b"[ false, nul", R(9, "not a JSON value: nul")),
    ("n_structure_unclosed_array_unfinished_true", b"[ false, tru", R(9, "not a JSON value: tru")),
    ("n_structure_unclosed_object", b'{"asd":"asd"', R(12, "unexpected end")),
    ("n_structure_whitespace_formfeed", b"[\x0c]", R(1, "byte 0x0c where a value")),
    ("n_structure_whitespace_nbsp", b"[\xc2\xa0]", R(1, "byte 0xc2 where a value")),
    # ---- i_: implementation-defined in JSONTestSuite, decided here
    ("i_number_double_huge_neg_exp", b"[123.456e-789]", [0.0]),
    (
        "i_number_huge_exp",
        b"[0.4e00669999999999999999999999999999999999999969999999006]",
        R(1, "too large"),
    ),
    ("i_number_neg_int_huge_exp", b"[-1e+9999]", R(1, "too large")),
    ("i_number_pos_double_huge_exp", b"[1.5e+9999]", R(1, "too large")),
    ("i_number_real_neg_overflow", b"[-123123e100000]", R(1, "too large")),
    ("i_number_real_pos_overflow", b"[123123e100000]", R(1, "too large")),
    ("i_number_real_underflow", b"[123e-10000000]", [0.0]),
    ("i_number_too_big_neg_int", b"[-123123123123123123123123123123]", R(1, "more than 19 digits")),
    ("i_number_too_big_pos_int", b"[100000000000000000000]", R(1, "more than 19 digits")),
    (
        "i_number_very_big_negative_int",
        b"[-237462374673276894279832749832423479823246327846]",
        R(1, "64-bit"),
    ),
    ("i_object_key_lone_2nd_surrogate", rb'{"\uDFAA":0}', R(2, "lone surrogate escape \\udfaa")),
    (
        "i_string_1st_surrogate_but_2nd_missing",
        rb'["\uDADA"]',
        R(2, "lone surrogate escape \\udada"),
    ),
    ("i_string_1st_valid_surrogate_2nd_invalid", rb'["\uD888\u1234"]', R(2, "no low surrogate")),
    ("i_string_UTF-16LE_with_BOM", b'\xff\xfe[\x00"\x00\xe9\x00"\x00]\x00', R(0, "byte 0xff")),
    ("i_string_UTF-8_invalid_sequence", b'["\xe6\x97\xa5\xd1\x88\xfa"]', R(7, "0xfa never occurs")),
    ("i_string_UTF8_surrogate_U+D800", b'["\xed\xa0\x80"]', R(2, "encoded surrogate")),
    ("i_string_incomplete_surrogate_and_escape_valid", rb'["\uD800\n"]', R(2, "lone surrogate")),
    ("i_string_incomplete_surrogate_pair", rb'["\uDd1ea"]', R(2, "no high surrogate")),
    ("i_string_incomplete_surrogates_escape_valid", rb'["\uD800\uD800\n"]', R(2, "lone surrogate")),
    ("i_string_invalid_lonely_surrogate", rb'["\ud800"]', R(2, "lone surrogate")),
    ("i_string_invalid_surrogate", rb'["\ud800abc"]', R(2, "lone surrogate")),
    ("i_string_invalid_utf-8", b'["\xff"]', R(2, "0xff never occurs")),
    ("i_string_inverted_surrogates_U+1D11E", rb'["\uDd1e\uD834"]', R(2, "no high surrogate")),
    ("i_string_iso_latin_1", b'["\xe9"]', R(2, "cut short")),
    ("i_string_lone_second_surrogate", rb'["\uDFAA"]', R(2, "lone surrogate")),
    ("i_string_lone_utf8_continuation_byte", b'["\x81"]', R(2, "stray continuation byte 0x81")),
    ("i_string_not_in_unicode_range", b'["\xf4\xbf\xbf\xbf"]', R(2, "beyond U+10FFFF")),
    ("i_string_overlong_sequence_2_bytes", b'["\xc0\xaf"]', R(2, "overlong")),
    (
        "i_string_overlong_sequence_6_bytes",
        b'["\xfc\x83\xbf\xbf\xbf\xbf"]',
        R(2, "0xfc never occurs"),
    ),
    (
        "i_string_overlong_sequence_6_bytes_null",
        b'["\xfc\x80\x80\x80\x80\x80"]',
        R(2, "never occurs"),
    ),
    ("i_string_truncated-utf-8", b'["\xe0\xff"]', R(2, "cut short")),
    ("i_string_utf16BE_no_BOM", b'\x00[\x00"\x00\xe9\x00"\x00]', R(0, "byte 0x00 where a value")),
    ("i_structure_500_nested_arrays", _nest(500), R(9, "nesting deeper than 8")),
    ("i_structure_UTF-8_BOM_empty_object", b"\xef\xbb\xbf{}", R(0, "byte order mark")),
    # ---- p_: this project's rules
    # UTF-8 (RFC 3629), every way to get it wrong
    ("p_utf8_overlong_nul", b'"\xc0\x80"', R(1, "overlong")),
    ("p_utf8_overlong_c1", b'"\xc1\xbf"', R(1, "overlong")),
    ("p_utf8_overlong_3_byte", b'"\xe0\x9f\xbf"', R(1, "overlong")),
    ("p_utf8_overlong_4_byte", b'"\xf0\x8f\xbf\xbf"', R(1, "overlong")),
    ("p_utf8_surrogate_dfff", b'"\xed\xbf\xbf"', R(1, "encoded surrogate")),
    ("p_utf8_surrogate_pair_as_cesu8", b'"\xed\xa0\xbd\xed\xb8\x80"', R(1, "encoded surrogate")),
    ("p_utf8_beyond_10ffff_f4", b'"\xf4\x90\x80\x80"', R(1, "beyond U+10FFFF")),
    ("p_utf8_beyond_10ffff_f5", b'"\xf5\x80\x80\x80"', R(1, "beyond U+10FFFF")),
    ("p_utf8_lead_f8", b'"\xf8\x88\x80\x80\x80"', R(1, "never occurs")),
    ("p_utf8_truncated_2_at_end", b'"\xc3', R(1, "cut short")),
    ("p_utf8_truncated_3", b'"\xe2\x82"', R(1, "cut short")),
    ("p_utf8_truncated_4", b'"\xf0\x9f\x98"', R(1, "cut short")),
    ("p_utf8_bad_third_byte", b'"\xe2\x82\x41"', R(1, "cut short")),
    ("p_utf8_bad_fourth_byte", b'"\xf0\x9f\x98\xc0"', R(1, "cut short")),
    (
        "p_utf8_after_valid_text",
        b'{"ok":"\xc3\xa9t\xc3\xa9","bad":"x\x80"}',
        R(22, "stray continuation"),
    ),
    ("p_utf8_in_key", b'{"\xed\xa0\x80":1}', R(2, "encoded surrogate")),
    # every raw control character is refused, DEL is not
    ("p_raw_ctrl_01", b'"\x01"', R(1, "raw control character 0x01")),
    ("p_raw_ctrl_1f", b'"a\x1f"', R(2, "raw control character 0x1f")),
    ("p_raw_ctrl_cr", b'"\r"', R(1, "raw control character 0x0d")),
    ("p_raw_ctrl_in_key", b'{"a\x08":1}', R(3, "raw control character 0x08")),
    ("p_raw_del_ok", b'"\x7f"', "\x7f"),
    ("p_escaped_ctrls_ok", rb'"\u0001\u001f\u007F"', "\x01\x1f\x7f"),
    ("p_surrogate_pair_then_text", rb'"\ud83d\ude00!"', "\U0001f600!"),
    ("p_high_surrogate_at_end", rb'"\ud83d', R(1, "lone surrogate")),
    ("p_two_highs", rb'"\ud83d\ud83d\ude00"', R(1, "lone surrogate escape \\ud83d")),
    # non-JSON words
    ("p_word_NaN", b"NaN", R(0, "not a JSON value: NaN")),
    ("p_word_Infinity", b"Infinity", R(0, "not a JSON value: Infinity")),
    ("p_word_minus_Infinity", b"-Infinity", R(0, "not a JSON value: -Infinity")),
    ("p_word_nan_lower", b"[nan]", R(1, "not a JSON value: nan")),
    ("p_word_None", b"None", R(0, "not a JSON value: None")),
    ("p_word_undefined", b"undefined", R(0, "not a JSON value: undefined")),
    ("p_word_nullx", b"nullx", R(0, "not a JSON value: nullx")),
    ("p_word_true1", b"true1", R(4, "'1' after the value")),
    ("p_word_NULL", b"NULL", R(0, "not a JSON value: NULL")),
    (
        "p_nan_in_config_set",
        b'{"type":"config_set","values":{"x":NaN}}',
        R(35, "not a JSON value: NaN"),
    ),
    # numbers: grammar
    ("p_num_plus", b"+1", R(0, "'+' where a value belongs")),
    ("p_num_leading_zeros", b"00", R(0, "leading zeros")),
    ("p_num_leading_zero_frac_ok", b"0.5", 0.5),
    ("p_num_dot5", b".5", R(0, "'.' where a value belongs")),
    ("p_num_1dot", b"1.", R(0, "digits after '.'")),
    ("p_num_hex", b"0x10", R(1, "'x' after the value")),
    ("p_num_exp_only", b"e5", R(0, "not a JSON value: e")),
    ("p_num_1e", b"1e", R(0, "digits in its exponent")),
    ("p_num_minus_minus", b"--1", R(0, "digit after '-'")),
    ("p_num_exp_leading_zeros_ok", b"1e007", 1e7),
    ("p_num_E_minus", b"25E-1", 2.5),
    # integers: the signed 64-bit range
    ("p_int_max", b"9223372036854775807", BIG),
    ("p_int_min", b"-9223372036854775808", -BIG - 1),
    ("p_int_max_plus_1", b"9223372036854775808", R(0, "64-bit range")),
    ("p_int_min_minus_1", b"-9223372036854775809", R(0, "64-bit range")),
    ("p_int_19_nines", b"9999999999999999999", R(0, "64-bit range")),
    ("p_int_20_digits", b"10000000000000000000", R(0, "more than 19 digits")),
    ("p_int_400_digits", b"[" + b"9" * 400 + b"]", R(1, "more than 19 digits")),
    ("p_int_2_to_30", b"1073741824", 1073741824),
    ("p_int_minus_zero", b"-0", 0),
    # fractions and exponents: magnitude below 1e38 (finite in single precision)
    ("p_float_just_below_limit", b"9.999999e37", 9.999999e37),
    ("p_float_38_nines", b"9" * 38 + b".0", float("9" * 38)),
    ("p_float_limit", b"1e38", R(0, "too large (magnitude 1e38 or more)")),
    ("p_float_limit_neg", b"-1e38", R(0, "too large")),
    ("p_float_limit_long", b"1" + b"0" * 38 + b".0", R(0, "too large")),
    ("p_float_limit_frac_form", b"0.1e39", R(0, "too large")),
    ("p_float_limit_leading_zero_frac", b"0.0001e42", R(0, "too large")),
    ("p_float_below_limit_frac_form", b"0.001e40", 1e37),
    ("p_float_1e300", b"1e300", R(0, "too large")),
    ("p_float_1e400", b"1e400", R(0, "too large")),
    ("p_float_max_double", b"1.7976931348623157e308", R(0, "too large")),
    ("p_float_zero_huge_exp", b"0e99999999999999999999", 0.0),
    ("p_float_neg_zero_huge_exp", b"-0.000e99999", -0.0),
    ("p_float_tiny", b"1e-30", 1e-30),
    ("p_float_underflow", b"1e-400", 0.0),
    ("p_float_neg_underflow", b"-1e-400", -0.0),
    ("p_float_huge_neg_exp_big_mantissa", b"9" * 300 + b"e-10000000000", 0.0),
    (
        "p_float_steinhart_a",
        b"[0.001129148,0.000234125,8.76741e-08]",
        [0.001129148, 0.000234125, 8.76741e-08],
    ),
    # duplicate keys, at any depth, also when spelled differently
    ("p_dup_top", b'{"type":"hello_request","type":"config_reset"}', R(24, 'duplicate key "type"')),
    ("p_dup_nested", b'{"a":{"b":1,"c":[{"d":1,"d":2}]}}', R(24, 'duplicate key "d"')),
    ("p_dup_escaped", rb'{"a":1,"\u0061":2}', R(7, 'duplicate key "a"')),
    ("p_dup_empty_key", b'{"":1,"":1}', R(6, 'duplicate key ""')),
    ("p_dup_non_ascii", b'{"\xc3\xa9":1,"\\u00e9":2}', R(8, 'duplicate key "\\u00e9"')),
    ("p_dup_after_many", b'{"a":1,"b":2,"c":3,"b":4}', R(19, 'duplicate key "b"')),
    ("p_not_dup_case", b'{"a":1,"A":2}', {"a": 1, "A": 2}),
    ("p_not_dup_other_objects", b'[{"a":1},{"a":2}]', [{"a": 1}, {"a": 2}]),
    # nesting: the CBOR decoder's levels (top 0, an item of a level-L container L+1)
    ("p_depth_8_arrays", _nest(9), [[[[[[[[[]]]]]]]]]),
    ("p_depth_9_arrays", _nest(10), R(9, "nesting deeper than 8")),
    ("p_depth_scalar_at_8", _nest(8, b"1"), [[[[[[[[1]]]]]]]]),
    ("p_depth_scalar_at_9", _nest(9, b"1"), R(9, "nesting deeper than 8")),
    ("p_depth_objects_at_8", _nest_obj(8, b"{}"), R(-1, "")),  # filled in below
    ("p_depth_key_at_9", _nest_obj(8, b'{"k":1}'), R(41, "nesting deeper than 8")),
    ("p_depth_values_map", b'{"type":"config_set","values":{"a":[[[[[[1]]]]]]}}', R(-1, "")),
    (
        "p_depth_values_map_deep",
        b'{"type":"config_set","values":{"a":[[[[[[[1]]]]]]]}}',
        R(42, "deeper than 8"),
    ),
    # length
    ("p_len_exactly_max", b'"' + b"a" * (MAX_LINE - 2) + b'"', "a" * (MAX_LINE - 2)),
    ("p_len_over_max", b'"' + b"a" * (MAX_LINE - 1) + b'"', R(MAX_LINE, "longer than 1024")),
    ("p_len_whitespace_counts", b" " * MAX_LINE + b"1", R(MAX_LINE, "longer than 1024")),
    ("p_len_100000_open_arrays", b"[" * 100000, R(MAX_LINE, "longer than 1024")),
    # whitespace: only SP, TAB, LF, CR
    ("p_ws_vertical_tab", b"\x0b1", R(0, "byte 0x0b where a value")),
    ("p_ws_only", b" \t\r\n", R(4, "unexpected end")),
    ("p_ws_nul_after", b"{}\x00", R(2, "byte 0x00 after the value")),
)


def _fill_in():
    """Entries whose value is easier to write as code."""
    out = []
    for name, data, want in CORPUS:
        if name == "p_depth_objects_at_8":
            want = {"k": {"k": {"k": {"k": {"k": {"k": {"k": {"k": {}}}}}}}}}
        elif name == "p_depth_values_map":
            want = {"type": "config_set", "values": {"a": [[[[[[1]]]]]]}}
        out.append((name, data, want))
    return out


CASES = _fill_in()


def _check(name, data, want):
    if isinstance(want, R):
        with raises(JSONError) as e:
            got = loads(data)
            raise AssertionError(f"{name}: accepted as {got!r}")
        err = e.value
        assert want.part in err.reason, (name, err.reason, want.part)
        assert err.offset == want.offset, (name, err.offset, want.offset, err.reason)
        assert str(err) == f"{err.reason} (at byte {err.offset})", (name, str(err))
        assert isinstance(err, ValueError)
        return
    got = loads(data)
    assert same(got, want), (name, got, want)


# --------------------------------------------------------------------------- the corpus


def test_corpus_names_are_unique_and_cover_every_kind():
    names = [c[0] for c in CASES]
    assert len(set(names)) == len(names), "duplicate corpus names"
    for prefix in ("y_", "n_", "i_", "p_"):
        assert len([n for n in names if n.startswith(prefix)]) >= 20, prefix


def test_corpus_accepted_values():
    n = 0
    for name, data, want in CASES:
        if not isinstance(want, R):
            _check(name, data, want)
            n += 1
    assert n > 100, n


def test_corpus_refusals_and_their_offsets():
    n = 0
    for name, data, want in CASES:
        if isinstance(want, R):
            _check(name, data, want)
            n += 1
    assert n > 200, n


def _lone_surrogates(v):
    if isinstance(v, str):
        for ch in v:
            if 0xD800 <= ord(ch) <= 0xDFFF:
                return True
    elif isinstance(v, list):
        for x in v:
            if _lone_surrogates(x):
                return True
    return False


def test_every_y_case_parses_as_json_loads_does():
    """The y_ cases agree with the interpreter's own json, except where MicroPython's
    json turns an escaped surrogate pair into two lone surrogates (this parser
    joins them, as CPython does)."""
    compared = 0
    for name, data, _want in CASES:
        if not name.startswith("y_"):
            continue
        theirs = json.loads(data)
        if IS_MICROPYTHON and _lone_surrogates(theirs):
            continue
        assert same(loads(data), theirs), (name, theirs)
        compared += 1
    assert compared >= 80, compared


def test_input_types():
    want = {"a": [1, "\u20ac"]}
    raw = b'{"a":[1,"\xe2\x82\xac"]}'
    for data in (raw, bytearray(raw), memoryview(raw), raw.decode()):
        assert same(loads(data), want), data
    # str input is measured and offset in UTF-8 bytes
    text = '"' + "\u20ac" * 341 + '"'  # 1025 bytes, 343 characters
    with raises(JSONError, match="longer than 1024"):
        loads(text)
    with raises(JSONError) as e:
        loads('["\u20ac", x]')
    assert e.value.offset == 8, e.value.offset
    with raises(TypeError):
        loads(123)


def test_parameters():
    assert jsonparse.DEFAULT_MAX_DEPTH == cbor.DEFAULT_MAX_DEPTH == 8
    assert jsonparse.DEFAULT_MAX_LEN == MAX_LINE
    assert same(loads(_nest(3), max_depth=2), [[[]]])
    with raises(JSONError, match="nesting deeper than 1"):
        loads(_nest(3), max_depth=1)
    assert loads(b"1", max_depth=0) == 1
    assert same(loads(b"[]", max_depth=0), [])
    with raises(JSONError, match="deeper than 0"):
        loads(b"[1]", max_depth=0)
    with raises(JSONError, match="deeper than 0"):
        loads(b'{"a":1}', max_depth=0)
    long = b"[" + b"1," * 5000 + b"1]"
    with raises(JSONError, match="longer than 1024"):
        loads(long)
    assert len(loads(long, max_len=len(long))) == 5001
    v = loads(_nest(40), max_depth=39)
    for _ in range(39):
        v = v[0]
    assert v == [], v


def test_depth_means_the_same_as_the_cbor_decoder():
    """For arrays and maps nested n deep, JSON and CBOR agree at every max_depth."""
    for n in range(0, 12):
        for max_depth in (0, 1, 5, 8):
            for kind in ("array", "map", "array_with_int"):
                if kind == "array":
                    js, cb = _nest(n + 1), b"\x81" * n + b"\x80"
                elif kind == "map":
                    js = b'{"k":' * n + b"{}" + b"}" * n
                    cb = b"\xa1\x61k" * n + b"\xa0"
                else:
                    js, cb = _nest(n, b"7"), b"\x81" * n + b"\x07"
                try:
                    cbor.loads(cb, max_depth)
                    cbor_ok = True
                except CBORDecodeError:
                    cbor_ok = False
                try:
                    loads(js, max_depth)
                    json_ok = True
                except JSONError:
                    json_ok = False
                assert json_ok == cbor_ok, (kind, n, max_depth, json_ok, cbor_ok)


def test_key_order_is_kept_on_cpython():
    got = loads(b'{"zeta":1,"b":2,"a":{"y":1,"x":2},"m":3}')
    assert got == {"zeta": 1, "b": 2, "a": {"y": 1, "x": 2}, "m": 3}
    if not IS_MICROPYTHON:  # MicroPython's dict keeps no order at all
        assert list(got) == ["zeta", "b", "a", "m"], list(got)
        assert list(got["a"]) == ["y", "x"]


def test_error_is_a_value_error_with_reason_and_offset():
    with raises(ValueError) as e:
        loads(b'{"a":1,"a":2}')
    err = e.value
    assert isinstance(err, JSONError)
    assert err.reason == 'duplicate key "a"' and err.offset == 7, (err.reason, err.offset)
    assert str(err) == 'duplicate key "a" (at byte 7)', str(err)
    # a long or odd key is shown bounded and ASCII-only
    with raises(JSONError) as e:
        loads(b'{"' + b"k" * 40 + b'\\n":1,"' + b"k" * 40 + b'\\n":1}')
    assert e.value.reason == 'duplicate key "' + "k" * 32 + '..."', e.value.reason


# --------------------------------------------------------------------------- the vectors


def test_vector_json_lines_parse_as_before():
    raw = read_repo_file("protocol/vectors/v1.json")
    doc = json.loads(raw)
    n = 0
    for v in doc["vectors"]:
        line = v["json_line"].encode()
        assert line.endswith(b"\n")
        got = loads(line)
        assert same(got, json.loads(line)), v["name"]
        assert got == json.loads(line), v["name"]  # exactly, floats included
        n += 1
    assert n >= 30, n
    # and the whole vector file, with its limits raised to fit
    whole = loads(raw, max_len=len(raw))
    assert whole == doc


# --------------------------------------------------------------------------- decode_line


def test_decode_line_refuses_a_repeated_type():
    line = b'{"type":"hello_request","type":"config_reset"}'
    with raises(CBORDecodeError, match="duplicate key") as e:
        jsonl.decode_line(line)
    assert e.value.kind == "undecodable"
    assert str(e.value).startswith("not valid JSON: "), str(e.value)
    dec = StreamDecoder(accept=None)
    got = dec.feed(line + b"\n")
    assert len(got) == 1 and not got[0].ok and got[0].kind == "undecodable", got
    assert dec.errors["undecodable"] == 1, dec.errors


def test_decode_line_refuses_deep_config_set_values():
    deep = b'{"type":"config_set","values":{"a":' + _nest(100, b"1") + b"}}"
    assert len(deep) < MAX_LINE
    with raises(CBORDecodeError, match="nesting deeper than 8"):
        jsonl.decode_line(deep)
    dec = StreamDecoder()
    got = dec.feed(deep + b"\n")
    assert len(got) == 1 and got[0].kind == "undecodable", got
    # as deep as CBOR allows still parses (the config layer validates the values)
    ok = b'{"type":"config_set","values":{"a":' + _nest(6, b"1") + b"}}"
    assert same(jsonparse.loads(ok)["values"]["a"], [[[[[[1]]]]]])


def test_decode_line_refuses_what_json_loads_let_through():
    for line in (
        b'{"type":"heartbeat","gpu_temp":NaN}',
        b'{"type":"heartbeat","gpu_temp":Infinity}',
        b'{"type":"heartbeat","gpu_temp":-Infinity}',
        b'{"type":"heartbeat","gpu_temp":1e400}',
        b'{"type":"heartbeat","gpu_temp":' + b"9" * 400 + b"}",
        b'{"type":"reboot","text":"\xc0\x80"}',
        b'{"type":"reboot","text":"a\x01b"}',
        b'{"type":"reboot","text":"\\ud800"}',
        b'{"type":"reboot",}',
        b'{"type":"reboot"} x',
        b'{"a":' + b"[" * (MAX_LINE - 10),
    ):
        with raises(CBORDecodeError, match="not valid JSON"):
            jsonl.decode_line(line)


def test_decode_line_still_reads_ordinary_lines():
    msg = jsonl.decode_line(b' {"type":"fan_mode","mode":"manual","duty1":40, "seq":3}\r')
    assert msg.name == "fan_mode" and msg.seq == 3, msg
    msg = jsonl.decode_line('{"type":"hello_request"}')
    assert msg.name == "hello_request"
