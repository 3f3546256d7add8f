package forge;

import java.io.BufferedWriter;
import java.io.IOException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.index.BinaryDocValues;
import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.index.LeafReaderContext;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.Query;
import org.apache.lucene.search.ScoreDoc;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.FSDirectory;

/**
 * Batch BM25 search over an Anserini index, writing a TREC run file.
 *
 * Same analyzer and bag-of-words query as Anserini's SearchCollection (loaded by reflection so this
 * compiles against Lucene alone), but hit ids come from the "id" doc values loaded once into an
 * array, instead of reading stored fields for every hit; ties go to the smaller external id.
 * Topics: "position TAB text" lines. Output: "position Q0 id rank score forge" lines, topic order.
 */
public final class BatchSearch {
  private BatchSearch() {}

  public static int run(String index, String topics, String output, int k, float k1, float b, int threads)
      throws Exception {
    List<String[]> queries = new ArrayList<>();
    for (String line : Files.readAllLines(Paths.get(topics), StandardCharsets.UTF_8)) {
      int tab = line.indexOf('\t');
      if (tab > 0) queries.add(new String[] {line.substring(0, tab), line.substring(tab + 1)});
    }
    Analyzer analyzer = (Analyzer) Class.forName("io.anserini.analysis.DefaultEnglishAnalyzer")
        .getMethod("newDefaultInstance").invoke(null);
    Object generator = Class.forName("io.anserini.search.query.BagOfWordsQueryGenerator")
        .getConstructor().newInstance();
    Method buildQuery = generator.getClass().getMethod("buildQuery", String.class, Analyzer.class, String.class);
    try (DirectoryReader reader = DirectoryReader.open(FSDirectory.open(Paths.get(index)))) {
      String[] ids = loadIds(reader);
      IndexSearcher searcher = new IndexSearcher(reader);
      searcher.setSimilarity(new BM25Similarity(k1, b));
      ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, threads));
      try {
        List<Future<String>> results = new ArrayList<>(queries.size());
        for (String[] q : queries) {
          results.add(pool.submit(() -> {
            Query query = (Query) buildQuery.invoke(generator, "contents", analyzer, q[1]);
            ScoreDoc[] hits = searcher.search(query, k).scoreDocs;
            // Equal scores: ascending external id, as Anserini breaks ties (internal docids depend
            // on indexing thread order, so they would make runs differ between index builds).
            Arrays.sort(hits, (x, y) -> x.score != y.score ? Float.compare(y.score, x.score) : ids[x.doc].compareTo(ids[y.doc]));
            StringBuilder sb = new StringBuilder(hits.length * 40);
            int rank = 1;
            for (ScoreDoc hit : hits) {
              sb.append(q[0]).append(" Q0 ").append(ids[hit.doc]).append(' ').append(rank++)
                  .append(' ').append(hit.score).append(" forge\n");
            }
            return sb.toString();
          }));
        }
        try (BufferedWriter out = Files.newBufferedWriter(Paths.get(output), StandardCharsets.UTF_8)) {
          for (Future<String> f : results) out.write(f.get());
        }
      } finally {
        pool.shutdown();
      }
      return queries.size();
    }
  }

  private static String[] loadIds(DirectoryReader reader) throws IOException {
    String[] ids = new String[reader.maxDoc()];
    for (LeafReaderContext leaf : reader.leaves()) {
      BinaryDocValues values = leaf.reader().getBinaryDocValues("id");
      if (values == null) throw new IOException("index has no 'id' doc values: not built by Anserini");
      for (int doc = values.nextDoc(); doc != BinaryDocValues.NO_MORE_DOCS; doc = values.nextDoc()) {
        ids[leaf.docBase + doc] = values.binaryValue().utf8ToString();
      }
    }
    return ids;
  }
}
