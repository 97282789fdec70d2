/* Keeps the benchmark helper library non-empty before any bench code
 * exists; holds nothing. */
typedef int kvs_empty_translation_unit;
